"""A copy of `st_repo` for the embed-output tests: tiny-st's manifest holds its prompts, Matryoshka dimensions [8, 16] and
calibration ranges for every (dimension, normalized|raw) (arbitrary fixed ranges, narrower than the vectors
so the clipping is exercised, in place of the export's own), and no default prompt (the core's answers then
equal sentence-transformers' encode with no prompt); tiny-mlm has no calibration ranges (int8 and uint8
refused on it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from tests.embedding_models import MATRYOSHKA_DIMENSIONS, MLM_MODEL, PROMPTS, ST_MODEL, version_dir

HIDDEN = 48


def fixed_ranges(dimension: int, seed: int) -> list[list[float]]:
    """[2][dimension]: per dimension a min in [-0.3, -0.05] and a max in [0.05, 0.3]."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-0.3, -0.05, dimension).tolist(), rng.uniform(0.05, 0.3, dimension).tolist()]


def make_options_repo(st_repo: Path, directory: Path) -> Path:
    repo = Path(directory) / "repo"
    shutil.copytree(st_repo, repo)
    path = version_dir(repo, ST_MODEL) / "manifest.json"
    manifest = json.loads(path.read_text())
    embed = manifest["tasks"]["embed"]
    embed["dimensions"] = embed.get("dimensions") or MATRYOSHKA_DIMENSIONS
    embed["prompts"] = embed.get("prompts") or PROMPTS
    embed["default_prompt_name"] = None
    embed["calibration_ranges"] = {
        f"{dimension}:{kind}": fixed_ranges(dimension, seed * 2 + (kind == "raw"))
        for seed, dimension in enumerate([*MATRYOSHKA_DIMENSIONS, HIDDEN])
        for kind in ("normalized", "raw")
    }
    path.write_text(json.dumps(manifest, indent=2))
    path = version_dir(repo, MLM_MODEL) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tasks"]["embed"]["calibration_ranges"] = {}
    path.write_text(json.dumps(manifest, indent=2))
    return repo
