"""A model named by its Hugging Face hub id, served from the node's hub cache (no network here).

The layout is the hub's own (https://huggingface.co/docs/hub/local-cache): with HF_HOME set, the
cache is $HF_HOME/hub, a repo ORG/NAME is its folder `models--ORG--NAME`, each downloaded
revision a folder under `snapshots/`, and `refs/main` names the revision a plain download
resolves to. vLLM loads through huggingface_hub, which reads that layout.
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# The hub client's default HF_HOME for root: where render binds the node's hf_cache unless the
# node's hf_cache_target says otherwise.
CONTAINER_HF_HOME = "/root/.cache/huggingface"
# The variables the hub client reads for where its cache is (huggingface/huggingface_hub,
# src/huggingface_hub/constants.py at 03333b68: HF_HUB_CACHE = getenv("HF_HUB_CACHE",
# HUGGINGFACE_HUB_CACHE), the legacy HUGGINGFACE_HUB_CACHE defaulting to $HF_HOME/hub).
HUB_CACHE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


# The hub folder below HF_HOME when nothing names another. HF_HUB_CACHE names the hub folder itself,
# whatever its name (huggingface_hub 2.4.0 src/huggingface_hub/constants.py:169 `default_cache_path =
# os.path.join(HF_HOME, "hub")`, :177-184 `HF_HUB_CACHE = ... os.getenv("HF_HUB_CACHE",
# HUGGINGFACE_HUB_CACHE)`; file_download.py joins it with models--ORG--NAME): the node's hf_hub_folder.
HUB_FOLDER = "hub"


def repo_folder(hf_home: Path, repo_id: str, hub_folder: str = HUB_FOLDER) -> Path:
    return hf_home / hub_folder / f"models--{repo_id.replace('/', '--')}"


def snapshot(hf_home: Path, repo_id: str, hub_folder: str = HUB_FOLDER) -> Path | None:
    """The snapshot a load of `repo_id` finds: the one refs/main names, else the only one; it must
    hold config.json. None when the cache does not hold the model. `hub_folder`: the hub folder's
    path below `hf_home` (the node's hf_hub_folder; "." when hf_home is the hub folder itself)."""
    repo = repo_folder(hf_home, repo_id, hub_folder)
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    snaps = repo / "snapshots"
    candidates = [snaps / main] if main else (sorted(snaps.iterdir()) if snaps.is_dir() else [])
    found = [c for c in candidates if (c / "config.json").is_file()]
    return found[0] if len(found) == 1 else None
