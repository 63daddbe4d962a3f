"""Tensor constructors and weight initializers (``needle.init``), as in the course."""
from .init_basic import constant, one_hot, ones, ones_like, rand, randb, randn, zeros, zeros_like
from .init_initializers import (
    calculate_gain,
    kaiming_normal,
    kaiming_uniform,
    xavier_normal,
    xavier_uniform,
)
