#!/bin/sh
# Prepare .gpucheck/ (ignored by git) for `make gpu-check` on a GPU machine without network:
# the NVIDIA header folders the CUDA emulator builds with (for the emulator-vs-GPU section)
# and the wheels of packages a GPU image with CuPy and PyTorch lacks. Run it in the repository
# root of a machine with network; copy .gpucheck/ with the tree (benchmarks/README.md, "GPU").
set -e
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpucheck/' "$exclude" 2>/dev/null || echo '/.gpucheck/' >> "$exclude"
rm -rf .gpucheck && mkdir -p .gpucheck/site-packages/nvidia .gpucheck/wheels
site=$(python3 -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))")
for sub in cuda_runtime cuda_nvcc cuda_cccl; do
    mkdir -p ".gpucheck/site-packages/nvidia/$sub"
    cp -r "$site/nvidia/$sub/include" ".gpucheck/site-packages/nvidia/$sub/"
done
# the course's public tests take numerical gradients with numdifftools (pure Python)
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpucheck/wheels numdifftools
du -sh .gpucheck
