"""The numba loop of ``adam_cpu.multi_tensor_adam`` (its own module: importing it imports numba)."""
import numba
import numpy as np


@numba.njit(cache=True, nogil=True, error_model="numpy")  # x / 0 is inf, as in NumPy
def adam_step(p, g, m, v, lr, wd, b1, one_m_b1, b2, one_m_b2, bc1, bc2, eps, decoupled):
    """Adam/AdamW on flat arrays in place; scalars in the accumulator dtype, in the order of
    multi_tensor.cu's adam_element."""
    for i in range(p.shape[0]):
        w = p[i]
        gi = g[i]
        if decoupled:
            w -= lr * wd * w
        else:
            gi += wd * w
        mi = b1 * m[i] + one_m_b1 * gi
        vi = b2 * v[i] + one_m_b2 * gi * gi
        m[i] = mi
        v[i] = vi
        w -= lr * (mi / bc1) / (np.sqrt(vi / bc2) + eps)
        p[i] = w
