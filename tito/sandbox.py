"""Where student code runs while it is graded: how a grading worker process is started.

Two levels, chosen by settings.ini [grading] sandbox (`auto` picks the strongest one available):

- `namespace` (Linux, running as root, with util-linux `unshare` and `setpriv`): the worker runs
  as the unprivileged user [grading] user (created with `useradd --system` when missing), in its
  own mount and PID namespaces: the course's `modules/`, `tinytorch/`, nbgrader folder and git data
  are covered by empty read-only mounts, `/tmp` and `/dev/shm` are private to the submission, and
  every process it starts dies with it.
- `none`: the worker runs as the grading user itself. Student code still gets its own working
  directory and HOME outside the course tree, a package with only the prerequisite modules, and
  the memory, process and time limits, but it can read (and write) whatever that user can.

Both set resource limits (address space, file size) before the worker starts.
"""
from __future__ import annotations

import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .course import CourseError

GRADER_USER = "tinytorch-grader"

# Runs as root inside the new namespaces, then drops to the grader user and starts the worker.
_NS_SCRIPT = r"""
set -e
uid="$1"; gid="$2"; tmpsize="$3"; privtmp="$4"; shift 4
while [ "$1" != "--" ]; do
  if [ -d "$1" ]; then mount -t tmpfs -o ro,size=4k,mode=000 tinytorch-hidden "$1";
  elif [ -e "$1" ]; then mount --bind /dev/null "$1"; fi
  shift
done
shift
if [ "$privtmp" = 1 ]; then mount -t tmpfs -o size="$tmpsize",mode=1777 tinytorch-tmp /tmp; fi
if [ -d /dev/shm ]; then mount -t tmpfs -o size="$tmpsize",mode=1777 tinytorch-shm /dev/shm; fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --bounding-set=-all -- "$@"
"""


@dataclass
class Sandbox:
    mode: str  # namespace | none
    user: str = ""
    hidden: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was set up (printed once per run)
    memory_bytes: int = 0
    tmp_bytes: int = 1 << 30
    # False when the course or its Python environment lives under /tmp: a private /tmp would hide
    # them, so /dev/shm (private all the same) becomes the submission's working and temporary folder
    private_tmp: bool = True

    def describe(self) -> str:
        if self.mode == "namespace":
            return (f"student code runs as user {self.user} in its own mount and PID namespaces; "
                    f"hidden from it: {', '.join(str(p) for p in self.hidden)}")
        return ("student code runs as you (no sandbox: see the README's instructor loop section); "
                "it gets its own working directory and HOME outside the course tree")

    def command(self, python: str, workdir: str) -> list[str]:
        worker = [python, "-m", "tito.grade_worker"]
        if self.mode != "namespace":
            return worker
        pw = pwd.getpwnam(self.user)
        return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
                "--", "/bin/sh", "-c", _NS_SCRIPT, "tinytorch-sandbox", str(pw.pw_uid), str(pw.pw_gid),
                str(self.tmp_bytes), "1" if self.private_tmp else "0", *[str(p) for p in self.hidden], "--", *worker]

    def workdir_base(self) -> str:
        # inside the namespace /tmp (or /dev/shm, see private_tmp) is a fresh private tmpfs
        if self.mode != "namespace":
            return ""
        return "/tmp/tinytorch-grading" if self.private_tmp else "/dev/shm/tinytorch-grading"

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
        if self.mode == "namespace":
            env["USER"] = self.user
            if not self.private_tmp:
                env["TMPDIR"] = "/dev/shm"
        return env

    def preexec(self):
        memory = self.memory_bytes

        def limits():
            os.setsid()  # its own process group: a Ctrl-C in the terminal reaches tito only
            if memory:
                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            fsize = 1 << 30
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if sys.platform.startswith("linux"):
                import ctypes

                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with tito

        return limits


def _git_dirs(root: Path) -> list[Path]:
    dot = root / ".git"
    if dot.is_dir():
        return [dot]
    if dot.is_file():  # a worktree: "gitdir: /repo/.git/worktrees/NAME"
        text = dot.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text.split(":", 1)[1].strip())
            common = gitdir.parent.parent if gitdir.parent.name == "worktrees" else gitdir
            return [dot, common]
    return []


def ensure_user(name: str) -> list[str]:
    """Make sure the unprivileged grader account exists (creating it when running as root)."""
    try:
        pwd.getpwnam(name)
        return []
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if os.geteuid() != 0 or useradd is None:
        raise CourseError(f"the grader user {name!r} does not exist and cannot be created here "
                          f"(needs root and useradd): create it, or set [grading] sandbox = none in settings.ini")
    proc = subprocess.run([useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent",
                           "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CourseError(f"could not create the grader user {name!r}: {proc.stderr.strip()}")
    return [f"created the unprivileged system user {name!r} to run student code"]


def namespace_available() -> str:
    """'' when the namespace sandbox can be used here, else why not."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.geteuid() != 0:
        return "tito is not running as root (needed to switch to the grader user)"
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"`{tool}` (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                            "/bin/sh", "-c", "mount -t tmpfs probe /tmp"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this machine does not allow mount namespaces ({probe.stderr.strip() or probe.returncode})"
    return ""


def make_sandbox(mode: str, user: str, hidden: list[Path], root: Path, memory_bytes: int) -> Sandbox:
    """The sandbox for this run; `mode` is settings.ini's auto | namespace | none."""
    if mode not in ("auto", "namespace", "none"):
        raise CourseError(f"settings.ini: [grading] sandbox = {mode!r} must be auto, namespace or none")
    if mode == "none":
        return Sandbox("none", memory_bytes=memory_bytes)
    why_not = namespace_available()
    if why_not:
        if mode == "namespace":
            raise CourseError(f"[grading] sandbox = namespace cannot be used: {why_not}")
        box = Sandbox("none", memory_bytes=memory_bytes)
        box.notes.append(f"no sandbox: {why_not}; student code runs with your permissions")
        return box
    notes = ensure_user(user)
    paths = [p for p in [*hidden, *_git_dirs(root)] if p.exists()]
    needed = [Path(sys.prefix), Path(sys.executable).resolve(), Path(__file__).resolve().parent, root]
    private_tmp = not any(Path("/tmp") in p.resolve().parents for p in needed) or not Path("/dev/shm").is_dir()
    if not private_tmp:
        notes.append("the course or its Python lives under /tmp, so /tmp stays the host's; each submission works "
                     "in its own private /dev/shm instead")
    return Sandbox("namespace", user=user, hidden=paths, notes=notes, memory_bytes=memory_bytes,
                   private_tmp=private_tmp)
