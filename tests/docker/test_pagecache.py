"""Reading weights ahead of the drain: bounded by MemAvailable, skipped with a reason."""

from __future__ import annotations

from pathlib import Path

from b70deploy.docker import pagecache
from b70deploy.docker.pagecache import plan_read

GIB = 1 << 30


def test_the_weights_are_read_only_when_they_fit_in_free_memory() -> None:
    files = [(Path("/m/a.safetensors"), 10 * GIB), (Path("/m/b.safetensors"), 5 * GIB)]
    assert plan_read(files, 20 * GIB).skip is None
    big = plan_read(files, 16 * GIB)  # 15 GiB > 80 % of 16 GiB
    assert big.skip is not None and "would not fit" in big.skip and "16.00 GiB" in big.skip
    assert "not read ahead" in big.note()
    assert plan_read(files, None).skip == "MemAvailable unknown (/proc/meminfo)"
    assert plan_read([], 20 * GIB).skip == "no model files found on this host"


def test_meminfo_is_parsed(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n")
    assert pagecache.mem_available(info) == 8_000_000 * 1024
    info.write_text("MemTotal: 1 kB\n")
    assert pagecache.mem_available(info) is None


def test_warm_reads_every_file_under_the_model_folders(tmp_path: Path) -> None:
    model = tmp_path / "Qwen" / "M"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "w.safetensors").write_bytes(b"\0" * (3 << 20))
    info = tmp_path / "meminfo"
    info.write_text("MemAvailable: 1000000 kB\n")
    assert pagecache.read_files(pagecache.weight_files([model, model / "config.json"])) == (3 << 20) + 2
    note = pagecache.warm([model], meminfo=info)
    assert note.startswith("page cache: read 2 file(s)")
    info.write_text("MemAvailable: 1 kB\n")
    assert "would not fit" in pagecache.warm([model], meminfo=info)
