"""The stand-in `vllm` package files inside the sim images, at the real relative paths.

Written for b70deploy (never copied from vLLM): just enough for patch extraction and
application to run for real, and for the sim server to ask the (possibly patched)
marlin_utils.py whether a MoE layer would take the CUDA-only Marlin path on XPU.
"""

from __future__ import annotations

from dataclasses import dataclass

MARLIN_REL = "model_executor/layers/quantization/utils/marlin_utils.py"
GPTQ_REL = "model_executor/layers/quantization/gptq.py"


@dataclass(frozen=True)
class Variant:
    """One sim image: its tag suffix, entrypoint style, vLLM version and package location."""

    name: str
    style: str                 # "bash-c" or "vllm-serve"
    version: str
    site_packages: str         # the folder holding vllm/ (on PYTHONPATH in the image)
    bin_dir: str               # where the `vllm` wrapper goes
    arctic: bool               # ships an arctic_inference stand-in
    marlin_drift: bool = False  # marlin_utils.py reworded: the carve-out edit no longer applies


VARIANTS: tuple[Variant, ...] = (
    Variant("bash-c", "bash-c", "0.21.1.dev17+g0a4756bb5", "/opt/venv/lib/python3.12/site-packages",
            "/opt/venv/bin", arctic=False),
    Variant("serve", "vllm-serve", "0.19.0", "/usr/local/lib/python3.12/dist-packages", "/usr/local/bin",
            arctic=True),
    Variant("bash-c-drift", "bash-c", "0.21.1.dev23+g5c1e2f9a0", "/opt/venv/lib/python3.12/site-packages",
            "/opt/venv/bin", arctic=False, marlin_drift=True),
)

_INIT = '''"""b70sim stand-in for the vllm package (not vLLM's code)."""

__version__ = "{version}"
'''

_PLATFORMS = '''"""The platform the sim pretends to run on: an Intel XPU."""


class _XpuPlatform:
    device_name = "xpu"

    def is_rocm(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return False

    def is_cuda_alike(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return True

    def is_cpu(self) -> bool:
        return False


current_platform = _XpuPlatform()
'''

# The carve-out patch edits the first statement of check_moe_marlin_supports_layer.
_MARLIN = '''"""Marlin kernel eligibility checks (b70sim stand-in)."""

from vllm.platforms import current_platform

MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]


def marlin_make_workspace(output_size_per_partition, device=None):
    return [0] * max(1, output_size_per_partition // 64)


def check_marlin_supports_shape(output_size_per_partition, input_size_per_partition, input_size, group_size):
    if output_size_per_partition % 64 != 0:
        return False, "output size is not a multiple of 64"
    if group_size not in MARLIN_SUPPORTED_GROUP_SIZES:
        return False, "unsupported group size"
    return True, None


def check_moe_marlin_supports_layer(layer, group_size):
    if current_platform.is_rocm():
        return False
    hidden_size = layer.hidden_size
    intermediate_size_per_partition = layer.intermediate_size_per_partition
    # Marlin MoE kernels tile the expert weights in blocks of 128 and 64.
    supports_shape = hidden_size % 128 == 0 and intermediate_size_per_partition % 64 == 0
    supports_group_size = group_size in MARLIN_SUPPORTED_GROUP_SIZES
    return supports_shape and supports_group_size
'''

# A later build: the platform gate moved into a helper, so the carve-out edit finds nothing.
_MARLIN_DRIFT = '''"""Marlin kernel eligibility checks (b70sim stand-in, a later build)."""

from vllm.platforms import current_platform

MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]


def _platform_has_marlin():
    # ROCm has no Marlin MoE kernels.
    return not current_platform.is_rocm()


def check_marlin_supports_shape(output_size_per_partition, input_size_per_partition, input_size, group_size):
    if output_size_per_partition % 64 != 0:
        return False, "output size is not a multiple of 64"
    if group_size not in MARLIN_SUPPORTED_GROUP_SIZES:
        return False, "unsupported group size"
    return True, None


def check_moe_marlin_supports_layer(layer, group_size):
    if not _platform_has_marlin():
        return False
    tiles_ok = layer.hidden_size % 128 == 0 and layer.intermediate_size_per_partition % 64 == 0
    return tiles_ok and group_size in MARLIN_SUPPORTED_GROUP_SIZES
'''

_GPTQ = '''"""GPTQ quantization config (b70sim stand-in)."""

from vllm.platforms import current_platform


class GPTQConfig:
    """Config for 4/8-bit GPTQ checkpoints."""

    def __init__(self, weight_bits, group_size, desc_act, lm_head_quantized=False):
        self.weight_bits = weight_bits
        self.group_size = group_size
        self.desc_act = desc_act
        self.lm_head_quantized = lm_head_quantized
        self.pack_factor = 32 // weight_bits

    @classmethod
    def get_name(cls):
        return "gptq"

    @classmethod
    def get_supported_act_dtypes(cls):
        return ["float16"]

    @classmethod
    def get_min_capability(cls):
        return 60

    def get_quant_method(self, layer, prefix):
        if current_platform.is_cuda_alike():
            return "GPTQLinearMethod"
        return None
'''


# The two modules `python -m` starts vLLM's server from: vllm/entrypoints/openai/api_server.py (its
# `__main__` parses the serve flags, the model as --model) and vllm/entrypoints/cli/main.py (what the
# `vllm` console script runs: `serve ...`). Each hands its argv to the sim server, as `vllm serve` does.
_API_SERVER = '''"""b70sim stand-in: python -m vllm.entrypoints.openai.api_server runs the simulated server."""

import os
import sys

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "/opt/b70sim/server.py", "serve", *sys.argv[1:]])
'''
_CLI_MAIN = '''"""b70sim stand-in: python -m vllm.entrypoints.cli.main runs the simulated `vllm` command."""

import os
import sys

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "/opt/b70sim/server.py", *sys.argv[1:]])
'''


def vllm_files(variant: Variant) -> dict[str, str]:
    """Files of the stand-in package, relative to the site-packages folder."""
    empty = '"""b70sim stand-in."""\n'
    files = {
        "vllm/__init__.py": _INIT.format(version=variant.version),
        "vllm/platforms/__init__.py": _PLATFORMS,
        "vllm/model_executor/__init__.py": empty,
        "vllm/model_executor/layers/__init__.py": empty,
        "vllm/model_executor/layers/quantization/__init__.py": empty,
        "vllm/model_executor/layers/quantization/utils/__init__.py": empty,
        f"vllm/{MARLIN_REL}": _MARLIN_DRIFT if variant.marlin_drift else _MARLIN,
        f"vllm/{GPTQ_REL}": _GPTQ,
        "vllm/entrypoints/__init__.py": empty,
        "vllm/entrypoints/openai/__init__.py": empty,
        "vllm/entrypoints/openai/api_server.py": _API_SERVER,
        "vllm/entrypoints/cli/__init__.py": empty,
        "vllm/entrypoints/cli/main.py": _CLI_MAIN,
    }
    if variant.arctic:
        files["arctic_inference/__init__.py"] = '"""b70sim stand-in for arctic-inference."""\n\n__version__ = "0.1.1"\n'
    return files
