"""The requirements of pyproject.toml's optional-dependency groups named on the command line, one per line:
`make build` installs them without installing the package itself (it builds in place)."""
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]
print("\n".join(sorted({req for name in sys.argv[1:] for req in extras[name]})))
