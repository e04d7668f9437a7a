"""Driving py-rattler-build and py-rattler offline: render, build with logs, index, install."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import rattler_build as rb
from source_tree import RECIPE_DIR

VARIANTS = RECIPE_DIR / "variants.yaml"
# Staged (multi-output cache) builds are still behind rattler-build's experimental flag.
RENDER = rb.RenderConfig(platform=rb.PlatformConfig(target_platform="linux-64", experimental=True))


def render(recipe: Path = RECIPE_DIR / "recipe.yaml") -> list[rb.RenderedVariant]:
    return rb.Stage0Recipe.from_file(recipe).render(rb.VariantConfig.from_file(VARIANTS), RENDER)


class _LogTail:
    """Keeps the build's log lines, so that a failure shows why it failed."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_log(self, event) -> None:
        self.lines.append(event.message)

    def __getattr__(self, name):  # download and step events: not needed
        return lambda *args: None


def build(recipe: Path, out: Path) -> list[Path]:
    """Build every output of `recipe` into `out`, running the package tests; the local out dir is the
    only channel (without one, rattler-build's tests reach for conda-forge)."""
    log = _LogTail()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.chdir(out):  # rattler-build leaves its staging_* caches in the working directory
            results = rb.Stage0Recipe.from_file(recipe).run_build(
                variant_config=rb.VariantConfig.from_file(VARIANTS),
                tool_config=rb.ToolConfiguration(test_strategy="native"),
                output_dir=out,
                channels=[out.as_uri()],
                progress_callback=log,
                render_config=RENDER,
            )
    except rb.RattlerBuildError as e:
        raise AssertionError("conda build failed; last log lines:\n" + "\n".join(log.lines[-80:])) from e
    return [p for r in results for p in r.packages]


def make_channel(packages: list[Path], channel: Path) -> str:
    """Copy `packages` into a fresh channel dir, index it, and return its URL."""
    from rattler.index import index_fs

    for subdir in ("linux-64", "noarch"):
        (channel / subdir).mkdir(parents=True, exist_ok=True)
    for package in packages:
        shutil.copy2(package, channel / "linux-64")
    asyncio.run(index_fs(channel, write_zst=False, write_shards=False))
    return channel.as_uri()


def install(channel: str, specs: list[str], prefix: Path, cache: Path) -> list[str]:
    """Solve `specs` against `channel` alone and install them into `prefix`; return the installed names."""
    import rattler

    async def run():
        records = await rattler.solve([channel], specs, platforms=["linux-64", "noarch"])
        await rattler.install(records, prefix, cache_dir=cache, show_progress=False)
        return sorted(r.name.normalized for r in records)

    return asyncio.run(run())
