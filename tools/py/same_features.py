"""Checks that the test build and the desktop build resolve every shared crate alike.

`make test` builds the workspace with its tests; `make desktop` builds the desktop crate
alone. Cargo picks each crate's features from what the selected packages ask for, so a
crate asked for more features by one build than by the other is compiled twice, and
with it everything above it: the whole stack, about 800 s on two cores. The
`shoal-workspace-hack` crate (crates/workspace-hack, written by `cargo hakari generate`)
makes the two agree; this check says when it no longer does, reading `cargo tree` only
(nothing is compiled).

usage: same_features.py REPO_ROOT
"""

import re
import subprocess
import sys

LINE = re.compile(r"(\S+ v\S+)(?: \(.*?\))? \[(.*)\]$")


def features(root: str, selection: list[str]) -> dict[str, set[str]]:
    """Each crate of the resolution with the features cargo turns on for it."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", *selection, "--prefix", "none", "--format", "{p} [{f}]"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    got: dict[str, set[str]] = {}
    for line in out.splitlines():
        line = line.replace(" (*)", "").replace(" (proc-macro)", "").strip()
        m = LINE.match(line)
        if m:
            got.setdefault(m.group(1), set()).update(f for f in m.group(2).split(",") if f)
    return got


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    tests = features(root, ["--workspace", "--exclude", "shoal-desktop"])
    desktop = features(root, ["-p", "shoal-desktop"])
    shared = sorted(set(tests) & set(desktop))
    differ = [k for k in shared if tests[k] != desktop[k]]
    for k in differ:
        print(
            f"  {k}: only in the test build {sorted(tests[k] - desktop[k])}, "
            f"only in the desktop build {sorted(desktop[k] - tests[k])}"
        )
    if differ:
        print(
            f"same_features: {len(differ)} of {len(shared)} shared crates get other features in "
            "the desktop build than in the test build, so `make desktop` would compile the stack "
            "again. Run `cargo hakari generate` (cargo install cargo-hakari --version 0.9.39)."
        )
        return 1
    print(f"same_features: the test and desktop builds agree on all {len(shared)} shared crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
