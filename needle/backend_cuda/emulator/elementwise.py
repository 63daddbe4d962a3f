"""The CUDA source of ``cupy.ElementwiseKernel`` for the emulator (``fake_cupy`` builds it).

CuPy turns ``ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x - y")`` into one
``extern "C" __global__`` kernel: a grid-stride loop over the broadcast shape in which each
array parameter is a reference to its element (``const float &x = _raw_x[_ind.get()]``) at the
byte strides of its (possibly strided or broadcast) view, then the operation. This writes that
kernel with the index arithmetic spelled out (shape and byte strides in one int64 array).
Parameter types are NumPy dtype names (``float`` is refused, as CuPy refuses it).
"""
from typing import List, Sequence

import numpy as np

# CuPy's _typenames_base (cupy/_core/_scalar.pyx); float16 needs CuPy's own half type: not here
CTYPE = {np.dtype("float64"): "double", np.dtype("float32"): "float",
         np.dtype("int64"): "long long", np.dtype("int32"): "int", np.dtype("int16"): "short",
         np.dtype("int8"): "signed char", np.dtype("uint64"): "unsigned long long",
         np.dtype("uint32"): "unsigned int", np.dtype("uint16"): "unsigned short",
         np.dtype("uint8"): "unsigned char", np.dtype("bool"): "bool"}
BLOCK = 128  # CuPy's default block_size


class Param:
    """One ``dtype name`` parameter of an ElementwiseKernel."""

    def __init__(self, text: str):
        words = text.split()
        if len(words) != 2:
            raise ValueError(f"ElementwiseKernel: expected 'dtype name', got {text!r} "
                             f"(raw and type placeholders are not emulated)")
        type_name, self.name = words
        try:
            dtype = np.dtype(type_name)
        except TypeError as e:
            raise ValueError(f"Wrong type {type_name}") from e
        if dtype.name != type_name:  # CuPy's check: "float" would mean float64
            raise ValueError(f"Wrong type {type_name}")
        if dtype not in CTYPE:
            raise NotImplementedError(f"ElementwiseKernel: {type_name} is not emulated")
        self.dtype, self.ctype = dtype, CTYPE[dtype]


def params(text: str) -> List[Param]:
    """The parameters of an ElementwiseKernel's ``in_params`` or ``out_params`` string."""
    return [Param(p) for p in text.split(",") if p.strip()]


def kernel_source(name: str, ins: Sequence[Param], outs: Sequence[Param],
                  is_array: Sequence[bool], operation: str, ndim: int) -> str:
    """The ``extern "C" __global__`` kernel for these parameters over ``ndim`` dimensions."""
    params, refs, offsets = [], [], []
    arrays = [p for p, a in zip(list(ins) + list(outs), is_array) if a]
    for p, is_arr in zip(list(ins) + list(outs), is_array):
        const = "const " if p in ins else ""
        if not is_arr:
            params.append(f"{p.ctype} {p.name}")
            continue
        j = arrays.index(p)
        params.append(f"{const}{p.ctype}* _raw_{p.name}")
        offsets.append(f"_off{j} += _k * _meta[{ndim * (j + 1)} + _d];")
        refs.append(f"{const}{p.ctype} &{p.name} = *({const}{p.ctype}*)"
                    f"(({const}char*)_raw_{p.name} + _off{j});")
    decl = " ".join(f"long long _off{j} = 0;" for j in range(len(arrays)))
    return (f'extern "C" __global__ void {name}({", ".join(params)}, '
            f"const long long* _meta, const long long _n) {{\n"
            f"  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < _n;\n"
            f"       i += (long long)blockDim.x * gridDim.x) {{\n"
            f"    long long _r = i; {decl}\n"
            f"    for (int _d = {ndim - 1}; _d >= 0; --_d) {{\n"
            f"      const long long _k = _r % _meta[_d]; _r /= _meta[_d];\n"
            f"      {' '.join(offsets)}\n"
            f"    }}\n    " + "\n    ".join(refs) + f"\n    {operation};\n  }}\n}}\n")
