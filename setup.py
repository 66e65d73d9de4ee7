"""The serving wheel's packages are pyproject.toml's; a development install (pip install -e .) maps
bench/ (bertserve.bench) and train/ (bertserve.train) too, which ship as distributions of their own
(bench/pyproject.toml, train/pyproject.toml). Editable installs of those beside this one would each
declare `bertserve` a namespace package and hide this one's regular package outside the checkout."""

from pathlib import Path

from setuptools import setup
from setuptools.command.editable_wheel import editable_wheel

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from setuptools._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent
TOOLS = ("bench", "train")  # folders holding a project whose packages live in the folder itself


class editable_with_tools(editable_wheel):
    def finalize_options(self) -> None:
        dist = self.distribution
        for folder in TOOLS:
            config = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["tool"]["setuptools"]
            for package, path in config["package-dir"].items():
                dist.package_dir[package] = Path(folder, path).as_posix()
            dist.packages.extend(p for p in config["packages"] if p not in dist.packages)
        super().finalize_options()


setup(cmdclass={"editable_wheel": editable_with_tools})
