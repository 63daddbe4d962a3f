"""2-D convolution layer (course hw4): NCHW in and out, NHWC inside for ``ops.conv``."""
from typing import Optional, Tuple, Union

from .. import init, numbers, ops
from ..autograd import Tensor
from ..backend_ndarray import BackendDevice
from ..backend_ndarray.fused_ops import has_primitive
from .nn_basic import _check_flag, in_weight_dtype
from .nn_module import Module, Parameter

__all__ = ["Conv"]


class Conv(Module):
    """Multi-channel 2-D convolution with square kernels; "same" padding (k // 2) by default.

    Weight (K, K, C_in, C_out) is Kaiming-uniform with fan_in = K*K*C_in; the bias is
    U(-1/sqrt(C_in*K*K), 1/sqrt(C_in*K*K)), as in the course.
    """

    def __init__(self, in_channels: int, out_channels: int,
                 kernel_size: Union[int, Tuple[int, ...]], stride: Union[int, Tuple[int, ...]] = 1,
                 bias: bool = True, device: Optional[BackendDevice] = None,
                 dtype: str = "float32", padding: Optional[int] = None) -> None:
        """Exercise hw4.nn.conv: in this order, weight = kaiming_uniform(fan_in=C_in*K*K,
        fan_out=C_out*K*K, shape=(K, K, C_in, C_out)); then, if ``bias``, bias = init.rand(C_out,
        low=-b, high=b) with b = 1 / sqrt(C_in * K * K). Same-size padding K // 2 by default."""
        super().__init__()
        if isinstance(kernel_size, tuple):
            if len(set(kernel_size)) != 1:
                raise ValueError(f"Conv supports square kernels only, got {kernel_size}")
            kernel_size = kernel_size[0]
        if isinstance(stride, tuple):
            if len(set(stride)) != 1:  # (2, 1) was read as 2
                raise ValueError(f"Conv supports equal strides only, got {stride}")
            stride = stride[0]
        _check_flag("Conv", "bias", bias)
        in_channels = numbers.count_arg(in_channels, "Conv: in_channels", lo=1)
        out_channels = numbers.count_arg(out_channels, "Conv: out_channels", lo=1)
        kernel_size = numbers.count_arg(kernel_size, "Conv: kernel_size", lo=1)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = numbers.count_arg(stride, "Conv: stride", lo=1)
        self.padding = kernel_size // 2 if padding is None else \
            numbers.count_arg(padding, "Conv: padding", lo=0)
        k = kernel_size
        ### BEGIN YOUR SOLUTION (hw4.nn.conv)
        self.weight = Parameter(init.kaiming_uniform(
            in_channels * k * k, out_channels * k * k, shape=(k, k, in_channels, out_channels),
            device=device, dtype=dtype))
        self.bias = None
        if bias:
            bound = 1.0 / (in_channels * k * k) ** 0.5
            self.bias = Parameter(init.rand(out_channels, low=-bound, high=bound,
                                            device=device, dtype=dtype))
        ### END YOUR SOLUTION

    # the device's conv kernels with the bias added in (ops.ConvBias) where offered, taken
    # inside forward's answer; False composes the layer on every device
    use_kernel = True

    def forward(self, x: Tensor) -> Tensor:
        """Exercise hw4.nn.conv: NCHW x -> NHWC, ``ops.conv`` with the layer's stride and padding,
        plus the bias broadcast over (N, H', W'), back to NCHW (N, C_out, H', W')."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"Conv({self.in_channels}, {self.out_channels}) expects NCHW input "
                             f"with {self.in_channels} channels, got {x.shape}")
        x = in_weight_dtype(x, self.weight)  # a float32 model computes in float32
        ### BEGIN YOUR SOLUTION (hw4.nn.conv)
        if (self.use_kernel and self.bias is not None and ops.Conv.use_kernel
                and has_primitive(x.device, "conv_im2col") and x.dtype == self.weight.dtype):
            nhwc = x.transpose((1, 2)).transpose((2, 3))             # a view: read in place
            out = ops.ConvBias(self.stride, self.padding)(nhwc, self.weight, self.bias)
            return out.transpose((2, 3)).transpose((1, 2))          # (N, C_out, H', W')
        nhwc = x.transpose((1, 2)).transpose((2, 3))                 # (N, H, W, C_in)
        out = ops.conv(nhwc, self.weight, stride=self.stride, padding=self.padding)
        if self.bias is not None:
            out = out + self.bias.reshape((1, 1, 1, self.out_channels)).broadcast_to(out.shape)
        return out.transpose((2, 3)).transpose((1, 2))              # (N, C_out, H', W')
        ### END YOUR SOLUTION

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, bias={self.bias is not None}")
