"""A failure in the few words a student can act on, for `tito test`'s tables (notebook cells and
package tests alike).

- numpy.testing writes a boilerplate line first ("Not equal to tolerance rtol=1e-07, atol=0") and
  the test's own message (`err_msg`) after it: the test's message is put first, then the numbers.
- A `RecursionError` names the function that called itself and says why that fails on a long graph
  (a recursive traversal goes one Python frame deeper per node).
- A failure deep inside another module's code (module 13's test failing in module 12's attention)
  names that module, its function and its file.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

_NUMPY_HEADER = re.compile(r"^(Not equal to tolerance|Arrays are not (almost )?(equal|less-ordered)|Items are not equal"
                           r"|Not almost equal|Not equal)")
_NUMPY_DETAIL = re.compile(r"^(Mismatched elements|Max (absolute|relative) difference|\(shapes|\(mismatch|x and y"
                           r"|ACTUAL|DESIRED|x:|y:)")

RECURSION_HINT = ("a recursive traversal goes one Python frame deeper per node, so a long graph (a chain of "
                  "100,000 ops) passes Python's limit of about 1000 frames; walk the graph with a loop and an "
                  "explicit stack (a list you push nodes on and pop them from) instead")


def message_lines(text: str) -> list[str]:
    """The non-empty lines of an exception message, the informative ones first.

    numpy.testing puts `err_msg` (the test's words: what was checked, received, expected) after its
    own header line; that message moves to the front, the header and the numbers follow it.
    """
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    header = next((i for i, ln in enumerate(lines) if _NUMPY_HEADER.match(ln)), None)
    if header is None:
        return lines
    own = []
    for ln in lines[header + 1:]:
        if _NUMPY_DETAIL.match(ln):
            break
        own.append(ln)
    return own + lines[:header + 1] + lines[header + 1 + len(own):]


def one_line(text: str, limit: int) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(name: str, message: str, max_lines: int = 12) -> str:
    """`Name: line; line; ...` with the informative lines first (see `message_lines`)."""
    lines = message_lines(message)
    if not lines:
        return f"{name} (no message)"
    text = f"{name}: " + "; ".join(lines[:max_lines])
    return text + ("; ..." if len(lines) > max_lines else "")


def recursion_note(function: str | None, times: int | None = None, where: str = "") -> str:
    """What a RecursionError means, naming the function that called itself when it is known."""
    who = f"{function}{f' ({where})' if where else ''}" if function else "a function"
    count = f" {times} times" if times else ""
    return f"{who} called itself{count} until Python's recursion limit: {RECURSION_HINT}"


def repeated_frame(tb) -> tuple[str, str, int] | None:
    """(qualified name, file, count) of the frame that repeats most in a traceback object: the recursion."""
    counts: Counter = Counter()
    while tb is not None:
        code = tb.tb_frame.f_code
        counts[(getattr(code, "co_qualname", code.co_name), code.co_filename)] += 1
        tb = tb.tb_next
    if not counts:
        return None
    (name, filename), n = counts.most_common(1)[0]
    return (name, filename, n) if n > 1 else None


def package_path(filename: str, root: Path | None = None) -> str | None:
    """`tinytorch/core/attention.py` for a file of the exported package (None for any other file)."""
    parts = Path(filename).parts
    if root is not None:
        try:
            rel = Path(filename).resolve().relative_to(root.resolve())
        except (ValueError, OSError):
            return None
        return rel.as_posix() if rel.parts and rel.parts[0] == "tinytorch" else None
    if "tinytorch" in parts:
        i = len(parts) - 1 - parts[::-1].index("tinytorch")
        return "/".join(parts[i:])
    return None


def module_of(rel_path: str, modules) -> object | None:
    """The course module whose notebook exports `tinytorch/...py` (None when no notebook does)."""
    for m in modules:
        for mod in getattr(m, "package_modules", None) or [m.package_module]:
            if mod and "/".join(mod.split(".")) + ".py" == rel_path:
                return m
    return None


def module_chain(frames: list[tuple[str, str]], modules, own_module: str | None,
                 root: Path | None = None) -> list[tuple[str, str, str]]:
    """The other modules a failure went through, deepest first: (module number, function,
    `tinytorch/...py`) for the deepest frame of each module on the way down, when the deepest frame in
    the exported package belongs to another module than `own_module`; [] otherwise (the failure is in
    the module's own code, or in no package code). `frames` are (filename, qualified function name),
    outermost first."""
    chain: list[tuple[str, str, str]] = []
    for filename, function in frames:
        rel = package_path(filename, root)
        m = module_of(rel, modules) if rel else None
        if m is None or function.endswith(".__call__"):  # `Module.__call__` only dispatches to forward
            continue
        if chain and chain[-1][0] == m.number:
            chain[-1] = (m.number, function, rel)
        else:
            chain.append((m.number, function, rel))
    if not chain or chain[-1][0] == own_module:
        return []
    return [c for c in reversed(chain) if c[0] != own_module]


def where_it_failed(frames: list[tuple[str, str]], modules, own_module: str | None, root: Path | None = None) -> str:
    """'the failure is inside module 03's Linear.forward (tinytorch/core/layers.py), called from module
    12's MultiHeadAttention.forward (tinytorch/core/attention.py)' when the failure was raised in
    another module's exported code (its callers on the way name where a bad input came from); ''
    otherwise."""
    chain = module_chain(frames, modules, own_module, root)
    if not chain:
        return ""
    text = "the failure is inside " + ", called from ".join(f"module {n}'s {fn} ({rel})" for n, fn, rel in chain[:3])
    return text + (" ..." if len(chain) > 3 else "")


def traceback_frames(tb) -> list[tuple[str, str]]:
    """(filename, qualified function name) of each frame of a traceback object, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, getattr(code, "co_qualname", code.co_name)))
        tb = tb.tb_next
    return frames


_IPY_FRAME = re.compile(r"^\s*(?:File (.+?\.py):\d+|Cell In\[\d+\], line \d+), in ([\w.<>]+)", re.M)
_IPY_SKIPPED = re.compile(r"skipping similar frames: ([\w.<>]+) at line \d+ \((\d+) times\)")


def text_frames(traceback_text: str) -> list[tuple[str, str]]:
    """(filename, function) of each frame of an IPython traceback's text, outermost first."""
    return [(m.group(1) or "<notebook cell>", m.group(2)) for m in _IPY_FRAME.finditer(traceback_text)]


def text_recursion(traceback_text: str) -> tuple[str, int] | None:
    """(function, times) from an IPython traceback that collapsed a recursion ('skipping similar frames')."""
    found = _IPY_SKIPPED.findall(traceback_text)
    if found:
        name, n = max(found, key=lambda f: int(f[1]))
        return name, int(n)
    names = Counter(fn for _, fn in text_frames(traceback_text))
    if names:
        name, n = names.most_common(1)[0]
        if n > 1:
            return name, n
    return None
