"""Data augmentations on single H x W x C images (NumPy's global RNG, as in the course)."""
import numpy as np

from .. import numbers


def _check_image(img: np.ndarray, name: str) -> None:
    """The transforms take one H x W x C image (a batch or a 2-D image ended deep in NumPy)."""
    if getattr(img, "ndim", None) != 3:
        raise ValueError(f"{name} takes one H x W x C image, got "
                         f"{getattr(img, 'shape', type(img).__name__)}")


class Transform:
    """A callable that maps one image to another."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class RandomFlipHorizontal(Transform):
    """Mirror the image left-right with probability ``p``."""

    def __init__(self, p: float = 0.5):
        self.p = numbers.real(p, "RandomFlipHorizontal: p", lo=0, hi=1)  # nan never flipped

    def __call__(self, img: np.ndarray) -> np.ndarray:
        """Flip an H x W x C image horizontally with probability ``p``."""
        _check_image(img, "RandomFlipHorizontal")
        flip_img = np.random.rand() < self.p
        ### BEGIN YOUR SOLUTION (hw2.data.transforms)
        return img[:, ::-1, :] if flip_img else img
        ### END YOUR SOLUTION


class RandomCrop(Transform):
    """Zero-pad by ``padding`` on each side, then crop back to the original size at random."""

    def __init__(self, padding: int = 3):
        self.padding = numbers.count(padding, "RandomCrop: padding", lo=0)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        """Shift an H x W x C image by a random offset in [-padding, padding], zero-filling."""
        _check_image(img, "RandomCrop")
        shift_x, shift_y = np.random.randint(low=-self.padding, high=self.padding + 1, size=2)
        ### BEGIN YOUR SOLUTION (hw2.data.transforms)
        p = self.padding
        h, w = img.shape[0], img.shape[1]
        padded = np.pad(img, ((p, p), (p, p), (0, 0)))
        return padded[p + shift_x:p + shift_x + h, p + shift_y:p + shift_y + w, :]
        ### END YOUR SOLUTION
