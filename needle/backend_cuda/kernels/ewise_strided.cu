// A binary elementwise op over two strided views of one shape (a broadcast bias, a transposed
// or sliced operand), each read in place: no full-size compact copy of either first.
//
// Not a file of its own at compile time: kernel_specs.source prepends strided.cu (load_meta and
// strided_index: the hw3 CUDA exercise, so a student release without it cannot load this
// either) and ewise.cu with its functors (ndl::Add, ...; store_result).
template <typename T, typename TOut, typename Op>
__global__ void ewise_strided(const T* a, const long long* meta_a, const T* b,
                              const long long* meta_b, TOut* out, long long n) {
  __shared__ long long a_shape[NDL_MAX_DIMS], a_strides[NDL_MAX_DIMS];
  __shared__ long long b_shape[NDL_MAX_DIMS], b_strides[NDL_MAX_DIMS];
  long long a_offset, b_offset;
  const int ndim = ndl::load_meta(meta_a, a_shape, a_strides, &a_offset);
  ndl::load_meta(meta_b, b_shape, b_strides, &b_offset);
  Op op;
  for (long long i = ndl::global_id(); i < n; i += ndl::grid_stride()) {
    const long long ia = ndl::strided_index(i, ndim, a_shape, a_strides, a_offset);
    const long long ib = ndl::strided_index(i, ndim, b_shape, b_strides, b_offset);
    out[i] = ndl::store_result<TOut>(op(ndl::to_acc(a[ia]), ndl::to_acc(b[ib])));
  }
}
