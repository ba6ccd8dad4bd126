"""Import circles between the files of each Rust crate, `make lint`'s check of the layout.

A file imports another when it names a path into it: `use crate::a::b`, `crate::a::b::X` in
code, `super::x`, `self::x`, or a child module by its bare name. A name a module only
re-exports (`pub use`) is followed to the file that has it; a name from another crate draws no
arrow. Each crate root (a library's lib.rs, a binary's main.rs) is read through its own `mod`
declarations. Test files (`*tests.rs`) and the `#[cfg(test)]` module at the end of a file are
left out, as are `mod x;` declarations themselves (owning a module is not using it). Files that
import each other in a loop form a circle (a strongly connected component of the graph).

The invariant (ARCHITECTURE.md): no circle of more than two files. A crate may be listed in
ALLOWED with the size its known circle has today, so the check holds while the circle is
being taken apart: it fails when a circle appears or grows, and asks for the allowance to be
lowered when one shrinks.

    python3 tools/py/import_circles.py [ROOT]     # exit 1 on a violation
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Circles larger than two files still being taken apart: crate folder -> the files in its
# largest circle today. Lower the number as the circle shrinks; remove the entry at 2.
ALLOWED: dict[str, int] = {}
LIMIT = 2
# Crates that keep no circle at all, not even of two files (ARCHITECTURE.md's invariant
# for the server: state and dialect identity below the handlers).
NO_CIRCLES = {"crates/shoal-api"}

USE = re.compile(r"\buse\s+([^;]+);", re.S)
PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
BARE = re.compile(r"(?<![:\w])([a-z_][a-z0-9_]*)::\w")
TEST_MOD = re.compile(r"^#\[cfg\(test\)\]\s*\n\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", re.M)


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` as flat paths."""
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0]]
    head, body = tree[:i], tree[i + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand(head + part)]


def strip_tests(text: str) -> str:
    m = TEST_MOD.search(text)
    return text[: m.start()] if m else text


INLINE_MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", re.M)


def flatten_inline_mods(text: str) -> str:
    """Inside an inline `mod x { … }`, `super::` is the file's own module: say `self::`."""
    out, pos = [], 0
    for m in INLINE_MOD.finditer(text):
        if m.start() < pos:
            continue
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += text[i] == "{"
            depth -= text[i] == "}"
            if depth == 0:
                break
            i += 1
        out.append(text[pos : m.end()])
        out.append(text[m.end() : i].replace("super::", "self::"))
        pos = i
    out.append(text[pos:])
    return "".join(out)


class Crate:
    """One crate's files, what each defines, and what each brings in by `use`."""

    def __init__(self, src: Path, root: Path):
        self.src = src
        # The files of the crate `root` (lib.rs or main.rs) makes: its `mod x;`, theirs, ….
        self.mods: dict[tuple[str, ...], Path] = {}
        todo = [((), root)]
        while todo:
            me, f = todo.pop()
            self.mods[me] = f
            folder = f.parent if f.name in ("lib.rs", "main.rs", "mod.rs") else f.with_suffix("")
            body = strip_tests(f.read_text(errors="replace"))
            for name in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", body, re.M):
                for cand in (folder / f"{name}.rs", folder / name / "mod.rs"):
                    if cand.is_file() and not cand.name.endswith("tests.rs"):
                        todo.append((me + (name,), cand))
                        break
        self.files = list(self.mods.values())
        self.where = {f: m for m, f in self.mods.items()}
        self.text = {}
        for f in self.files:
            t = re.sub(r"//[^\n]*", "", strip_tests(f.read_text(errors="replace")))
            self.text[f] = flatten_inline_mods(t)
        # name -> the path it was brought in by, per file
        self.uses: dict[Path, dict[str, list[str]]] = {}
        for f in self.files:
            names: dict[str, list[str]] = {}
            for u in USE.findall(self.text[f]):
                for p in expand(u.strip()):
                    alias = p.split("as", 1)[1] if "as" in p and re.search(r"\bas\b", p) else None
                    seg = [x for x in re.split(r"::", re.sub(r"\s*\bas\b.*", "", p)) if x]
                    if seg and seg[-1] != "*":
                        names[(alias or seg[-1]).strip()] = seg
            self.uses[f] = names

    def children(self, me: tuple[str, ...]) -> set[str]:
        return {m[-1] for m in self.mods if len(m) == len(me) + 1 and m[: len(me)] == me}

    def absolute(self, me: tuple[str, ...], seg: list[str]) -> list[str] | None:
        """A path as seen from module `me`, from the crate root; None if outside the crate."""
        if not seg:
            return None
        if seg[0] == "crate":
            return seg[1:]
        if seg[0] == "self":
            return list(me) + seg[1:]
        if seg[0] == "super":
            base, rest = list(me), seg
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            return base + rest
        if seg[0] in self.children(me):
            return list(me) + seg
        return None

    def target(self, path: list[str], depth: int = 0) -> Path | None:
        """The file that defines what a crate-rooted path names, following re-exports."""
        for n in range(len(path), -1, -1):
            if tuple(path[:n]) in self.mods:
                f, rest = self.mods[tuple(path[:n])], [r for r in path[n:] if r != "*"]
                break
        else:
            return None
        if not rest or depth > 8:
            return f
        name = rest[0]
        # A name the file brought in by `use` is followed to where it comes from (a method
        # of the same name defined here is not an item of the module).
        via = self.uses[f].get(name)
        if via is not None:
            nxt = self.absolute(self.where[f], via)
            # Brought in from outside the crate: no file of this crate is used.
            return self.target(nxt + rest[1:], depth + 1) if nxt is not None else None
        return f

    def graph(self) -> dict[Path, set[Path]]:
        graph: dict[Path, set[Path]] = {f: set() for f in self.files}
        for f in self.files:
            me = self.where[f]
            text = self.text[f]
            paths: list[list[str]] = [seg for seg in self.uses[f].values()]
            paths.extend([m.group(1)] + m.group(2).split("::")[1:] for m in PATH.finditer(text))
            kids = self.children(me)
            for m in BARE.finditer(text):
                if m.group(1) in kids:
                    tail = re.match(r"(?:::\w+)+", text[m.end(1):])
                    paths.append(["self", m.group(1)] + (tail.group(0).split("::")[2:] if tail else []))
            for seg in paths:
                path = self.absolute(me, [s for s in seg if s])
                if path is None:
                    continue
                t = self.target(path)
                if t is not None and t != f:
                    graph[f].add(t)
        return graph


def crate_graph(src: Path) -> dict[Path, set[Path]]:
    """Every file's imports, over each crate root the folder has (a library and a binary)."""
    graph: dict[Path, set[Path]] = {}
    for root in (src / "lib.rs", src / "main.rs"):
        if root.is_file():
            for f, ts in Crate(src, root).graph().items():
                graph.setdefault(f, set()).update(ts)
    return graph


def circles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    out: list[list[Path]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: Path) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    crates = sorted(p.parent for p in root.glob("crates/*/src")) + [root / "src-tauri"]
    failed = False
    for crate in crates:
        src = crate / "src"
        if not src.is_dir():
            continue
        name = str(crate.relative_to(root))
        allowed = 0 if name in NO_CIRCLES else ALLOWED.get(name, LIMIT)
        found = circles(crate_graph(src))
        largest = max((len(c) for c in found), default=0)
        for c in found:
            files = ", ".join(str(f.relative_to(src)) for f in c)
            over = len(c) > allowed
            failed |= over
            print(f"{'FAIL' if over else 'ok  '} {name}: a circle of {len(c)} files: {files}")
        if allowed > LIMIT and largest < allowed:
            print(f"FAIL {name}: its largest circle is down to {largest} files; lower ALLOWED to "
                  f"{max(largest, LIMIT)} in tools/py/import_circles.py")
            failed = True
    print(f"import circles: {'over the limit' if failed else 'none over the limit'} "
          f"(at most {LIMIT} files; none in {sorted(NO_CIRCLES)}; allowed for now: {ALLOWED})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
