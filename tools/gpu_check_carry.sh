#!/bin/sh
# Prepare .gpucheck/ (ignored by git) for `make gpu-check` on a lent GPU machine (no network):
# the NVIDIA header folders the CUDA emulator builds with (for the emulator-vs-GPU section)
# and the wheels of packages the GPU image lacks. Run here, in the repository root; then the
# device run carries .gpucheck (see benchmarks/README.md, "GPU check").
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
