"""needle: an educational deep learning systems framework (autodiff, NDArray, nn, parallel)."""
from setuptools import find_packages, setup

setup(
    name="needle",
    version="0.1.0",
    description="Educational deep learning systems framework in the spirit of CMU 10-414/714",
    packages=find_packages(include=["needle", "needle.*"]),
    python_requires=">=3.9",
    install_requires=["numpy>=1.23", "ml_dtypes>=0.3", "mpi4py>=3.1", "mpich", "tqdm",
                      "scikit-learn", "threadpoolctl>=3",
                      # needle.compile's CPU kernels (fused_elementwise_cpu.py says why)
                      "numba>=0.59"],
    extras_require={
        "cuda": ["cupy-cuda12x"],
        # NVRTC + CUDA headers let CI compile every kernel source without a GPU
        # coverage: the student-release check; nbclient/ipykernel/matplotlib: the notebooks
        # nvcc (crt/host_defines.h) + cccl (nv/target): cuda_fp16.h under g++ for the CUDA emulator
        # mypy: `make lint` type-checks the packages mypy.ini lists
        "dev": ["pytest>=7", "hypothesis>=6", "ruff>=0.6", "mypy>=1.10",
                "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12",
                "nvidia-cuda-cccl-cu12",
                "coverage>=7", "nbclient>=0.7", "nbformat>=5", "ipykernel>=6", "matplotlib>=3.5",
                # the course's public tests take numerical gradients with numdifftools
                "numdifftools>=0.9",
                # real CuPy imports without a GPU: tests/backend_cuda/test_cupy_contract.py
                # checks the backend's and the emulator's CuPy calls against it
                "cupy-cuda12x>=13",
                # `jupyter notebook notebooks/` (and `jupyter lab`): the homework notebooks;
                # ipywidgets: tqdm's progress bars in them (a warning without it)
                "notebook>=7", "ipywidgets>=8"],
    },
)
