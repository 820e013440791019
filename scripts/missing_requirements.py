"""Print the requirements (one per line) that this Python does not satisfy yet, of those given as arguments.

``scripts/setup_isaac3.sh --target DIR`` installs into a folder for a Python that already has torch and much
else: ``pip --target`` ignores what that Python has, so asking it for every listed package would reinstall
(or, with ``--wheels``, demand a wheel of) packages that are already there. This script keeps only those
whose distribution is absent, or present at a version outside the requirement's specifier::

    python3 scripts/missing_requirements.py "numpy" "warp-lang==1.17.0" "gymnasium>=1.1,<2"

It runs before anything is installed, so it needs only the standard library and pip (whose vendored
``packaging`` parses the specifiers; a standalone ``packaging`` is used where present). A malformed
requirement is an error naming it (exit 2). Environment markers are honoured (a requirement whose marker is
false for this Python is left out).
"""

from __future__ import annotations

import importlib.metadata
import sys


def _packaging():
    try:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.version import InvalidVersion, Version
    except ImportError:
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
        from pip._vendor.packaging.version import InvalidVersion, Version
    return Requirement, InvalidRequirement, Version, InvalidVersion


def missing(requirements: list[str]) -> list[str]:
    """The requirements of ``requirements`` this Python lacks (absent, or installed at another version)."""
    requirement_class, invalid_requirement, version_class, invalid_version = _packaging()
    lacking = []
    for text in requirements:
        try:
            requirement = requirement_class(text)
        except invalid_requirement as error:
            reason = str(error).splitlines()[0].strip()
            raise ValueError(f"requirement {text!r}: expected a PEP 508 requirement ({reason})") from None
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            lacking.append(text)
            continue
        try:
            version = version_class(installed)
        except invalid_version:
            lacking.append(text)  # an unparseable installed version satisfies nothing
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            lacking.append(text)
    return lacking


def main(argv: list[str]) -> int:
    try:
        lacking = missing(argv)
    except ValueError as error:
        print(f"missing_requirements: {error}", file=sys.stderr)
        return 2
    for text in lacking:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
