"""What the scripts and docs say about where a package comes from matches pyproject.toml:
a package said to be in an extra is in that extra, and one said to be benchfarm's own
dependency is in `dependencies` (scripts/postgres.sh once put psycopg, a runtime
dependency, in the test extra)."""

from __future__ import annotations

import re
import tomllib

from harness import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
IN_EXTRA = re.compile(r"\b([A-Za-z][\w.-]*) (?:is|are) in the `(\w+)` extra")
OWN = re.compile(r"\b([A-Za-z][\w.-]*), the [\w ]+, is one of benchfarm's own\s*(?:#\s*)?"
                 r"dependencies")


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def texts() -> dict[str, str]:
    paths = [REPO_ROOT / "README.md", *(REPO_ROOT / "scripts").glob("*.sh"),
             *(REPO_ROOT / "docs").glob("*.md")]
    return {str(p.relative_to(REPO_ROOT)): p.read_text() for p in paths}


def test_every_package_is_where_the_text_says() -> None:
    extras = {name: names(reqs) for name, reqs in PYPROJECT["optional-dependencies"].items()}
    own = names(PYPROJECT["dependencies"])
    claims = 0
    for path, text in texts().items():
        for package, extra in IN_EXTRA.findall(text):
            claims += 1
            assert package.lower() in extras.get(extra, set()), (
                f"{path}: {package} is not in the {extra!r} extra")
        for package in OWN.findall(text):
            claims += 1
            assert package.lower() in own, f"{path}: {package} is not a dependency"
    assert claims  # the postgres script's claim is among them
