"""Where student code runs while it is graded: how a grading worker process is started.

Three levels, chosen by settings.ini [grading] sandbox (`auto` picks the first that is available:
bwrap, then namespace, then none; the report and every log say which one ran):

- `bwrap` (bubblewrap, a Debian/Ubuntu package: `apt-get install bubblewrap`): the worker sees a
  new root holding read-only binds of exactly what it needs (the system's /usr, the interpreter and
  its standard library, the virtual environment, tito's own code) and nothing else: no course
  checkout, no home directory, no other user's files. /tmp is private, there is no network
  (`--unshare-net`), it has its own PID namespace (`--unshare-pid`, every process it starts dies
  with it), a new session (`--new-session`) and it dies with tito (`--die-with-parent`). Running as
  root, the worker then drops to an unused numeric user id (one per worker slot; no account is
  created) so that the process limit counts only that submission's processes.
- `namespace` (Linux, root, util-linux `unshare` and `setpriv`): the older script. The worker runs
  under the same numeric user id in its own mount and PID namespaces; the course's `modules/`,
  `tinytorch/`, nbgrader folder and git data are covered by empty mounts, `/tmp` and `/dev/shm` are
  private, but the rest of the file system stays readable to it.
- `none`: the worker runs as the grading user itself, in a temporary folder, with the same limits.

All set resource limits before the worker starts: address space (`[grading] memory_gb`), file size,
no core files, and a process count (`[grading] max_processes`: a fork bomb stops there).

Grading starts every sandboxed process in Python's isolated mode (`python -I`: no writable folder
on sys.path, no PYTHONPATH) from a copy of only the tito code it needs (`tito.trusted.code_tree`,
bound read-only at /opt/tito under bwrap), with a working directory the student cannot write.

Limits per run and per submission, never per host:

- user ids: each grading run leases its own range of unused numeric user ids (`UidLease`, under a lock
  on a registry shared by every tito process on the machine), so two runs never share a user id or its
  process limit;
- memory and processes of the whole sandbox of one submission (worker, kernel, probe processes and
  everything they start): a cgroup per submission (`Cgroups`: cgroup v2 `memory.max`, `memory.swap.max`
  and `pids.max`, or the v1 memory and pids controllers), made when tito runs as root on a machine that
  has them. The documented fallback elsewhere: the address-space limit per process (`RLIMIT_AS`) and the
  process limit per user id (`RLIMIT_NPROC`, which the leased user ids make per submission); the report
  says which applies. Each process also keeps `RLIMIT_AS`, so one huge allocation fails with a
  MemoryError in the cell instead of killing the kernel.

`preflight()` starts the worker exactly as grading will and explains in one line, with the fix,
why it cannot start (for example an interpreter under a private home directory that the sandbox
user cannot read), before any submission is tried.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import pwd
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

from .course import CourseError

MODES = ("auto", "bwrap", "namespace", "none")
CODE_MOUNT = "/opt/tito"  # where a grading sandbox sees its copy of the tito code (bwrap)
# python -I -c BOOT CODE_ROOT MODULE: run MODULE with only CODE_ROOT added to sys.path (tito.trusted.BOOT)
BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); import runpy; "
        "runpy.run_module(sys.argv[2], run_name='__main__', alter_sys=True)")
UID_BASE = 61000  # numeric user ids for the sandbox (one per worker slot): never in /etc/passwd, never created

# Runs as root inside the new namespaces, then drops to the sandbox user and starts the worker.
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

# The namespace script for isolated processes: the same, then `cd` into the directory given after the flags.
_NS_SCRIPT_CD = _NS_SCRIPT.replace('privtmp="$4"; shift 4', 'privtmp="$4"; workdir="$5"; shift 5').replace(
    'exec setpriv', 'cd "$workdir"\nexec setpriv')

# Joins the cgroups whose cgroup.procs files come before `--`, then runs the rest (Sandbox.launcher)
_JOIN_CGROUP = r"""
while [ "$1" != "--" ]; do
  if ! echo $$ > "$1"; then echo "tito: cannot join the submission's cgroup ($1)" >&2; exit 125; fi
  shift
done
shift
exec "$@"
"""

# files of /etc a Python process and a Jupyter kernel may read (name resolution of localhost, time zone)
_ETC = ("ld.so.cache", "ld.so.conf", "localtime", "nsswitch.conf", "hosts", "passwd", "group", "mime.types")


def _free_uids(n: int) -> list[int]:
    """`n` unused user ids for this process, leased so that no other tito process on the machine gets them while
    it lives (one run per process: the sandboxes a process makes one after another share its lease)."""
    return UidLease.for_process(n).uids[:n]


def _registry() -> Path:
    run = Path("/run")
    base = run if os.geteuid() == 0 and run.is_dir() and os.access(run, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"tito-sandbox-uids-{os.geteuid()}.json"


def _alive(pid: int, started: float) -> bool:
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except psutil.Error:
        return False


@dataclass
class UidLease:
    """A range of user ids for one process's sandboxes, recorded in a registry that every tito process on the
    machine reads and writes under an exclusive lock (fcntl): ranges of live processes are never handed out
    again; those of dead ones are."""
    uids: list[int]

    _held: ClassVar[list] = []
    _process: ClassVar[list] = []  # the lease this process's sandboxes share (for_process)

    @classmethod
    def for_process(cls, n: int) -> "UidLease":
        """This process's lease, grown to at least `n` ids (released when the process ends)."""
        if cls._process and len(cls._process[0].uids) >= n:
            return cls._process[0]
        if cls._process:
            cls._process.pop().release()
        cls._process.append(cls.acquire(n))
        return cls._process[0]

    @classmethod
    def acquire(cls, n: int) -> "UidLease":
        import fcntl

        import psutil

        path = _registry()
        me = {"pid": os.getpid(), "started": psutil.Process().create_time()}
        with open(path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entries = json.loads(path.read_text()) if path.exists() else []
            except ValueError:
                entries = []
            entries = [e for e in entries if isinstance(e, dict) and _alive(int(e.get("pid", 0)),
                                                                              float(e.get("started", 0)))]
            taken = {u for e in entries for u in e.get("uids", [])}
            uids, uid = [], UID_BASE
            while len(uids) < n:
                if uid not in taken:
                    try:
                        pwd.getpwuid(uid)
                    except KeyError:
                        uids.append(uid)
                uid += 1
            entries.append({**me, "uids": uids})
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entries))
            os.replace(tmp, path)
        lease = cls(uids)
        if not cls._held:
            atexit.register(cls.release_all)
        cls._held.append(lease)
        return lease

    @classmethod
    def release_all(cls) -> None:
        for lease in list(cls._held):
            lease.release()

    def release(self) -> None:
        import fcntl

        if self not in self._held:
            return
        self._held.remove(self)
        path = _registry()
        try:
            with open(path.with_suffix(".lock"), "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                entries = json.loads(path.read_text()) if path.exists() else []
                entries = [e for e in entries if not (e.get("pid") == os.getpid() and e.get("uids") == self.uids)]
                tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(entries))
                os.replace(tmp, path)
        except (OSError, ValueError):
            pass


# ------------------------------------------------------------------ cgroups: limits for a whole submission


class Cgroups:
    """One cgroup per submission's sandbox with memory and process limits for all its processes together.

    `Cgroups.detect(memory, pids)` finds what the machine offers (cgroup v2 with the memory and pids
    controllers, else the v1 memory and pids hierarchies; tito must run as root) and makes a folder for
    this run; `group(name)` makes one submission's group (`Group`). `kind` is "v2", "v1" or "" (none: the
    fallback limits apply) and `why` says why none."""

    def __init__(self, kind: str, roots: list[Path], memory_bytes: int, max_processes: int, why: str = ""):
        self.kind, self.roots, self.memory_bytes, self.max_processes, self.why = kind, roots, memory_bytes, \
            max_processes, why
        self.count = 0

    @classmethod
    def detect(cls, memory_bytes: int, max_processes: int) -> "Cgroups":
        if not sys.platform.startswith("linux"):
            return cls("", [], memory_bytes, max_processes, "not Linux")
        if os.geteuid() != 0:
            return cls("", [], memory_bytes, max_processes, "tito is not running as root")
        name = f"tito-grading-{os.getpid()}"
        unified = Path("/sys/fs/cgroup")
        try:
            if (unified / "cgroup.controllers").exists():
                have = (unified / "cgroup.controllers").read_text().split()
                if not {"memory", "pids"} <= set(have):
                    return cls("", [], memory_bytes, max_processes, "cgroup v2 without the memory and pids controllers")
                top = unified / "tito-grading"
                for folder in (unified, top):
                    folder.mkdir(exist_ok=True)
                    ctl = (folder / "cgroup.subtree_control").read_text().split()
                    if not {"memory", "pids"} <= set(ctl):
                        (folder / "cgroup.subtree_control").write_text("+memory +pids")
                root = top / name
                root.mkdir(exist_ok=True)
                (root / "cgroup.subtree_control").write_text("+memory +pids")
                return cls("v2", [root], memory_bytes, max_processes)
            roots = []
            for ctl in ("memory", "pids"):
                mount = unified / ctl
                if not (mount / "cgroup.procs").exists():
                    return cls("", [], memory_bytes, max_processes, f"no cgroup {ctl} controller mounted")
                mine = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                             if ctl in ln.split(":", 2)[1].split(",")), "/")
                root = mount / mine.lstrip("/") / name
                root.mkdir(exist_ok=True)
                roots.append(root)
            return cls("v1", roots, memory_bytes, max_processes)
        except OSError as e:
            return cls("", [], memory_bytes, max_processes, f"cgroups cannot be made here ({e.strerror or e})")

    def describe(self) -> str:
        mem = f"{self.memory_bytes / 2 ** 30:g} GiB" if self.memory_bytes else "no memory limit"
        if self.kind:
            return (f"limits per submission (cgroup {self.kind}): {mem} and {self.max_processes} processes for all of "
                    "its processes together")
        return (f"limits per process and user id (no cgroups: {self.why}): {mem} of address space per process, "
                f"{self.max_processes} processes per sandbox user id")

    def group(self, name: str) -> "Group | None":
        if not self.kind:
            return None
        self.count += 1
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60] + f"-{self.count}"
        return Group(self, [r / safe for r in self.roots])

    def close(self) -> None:
        for r in self.roots:
            for child in r.iterdir() if r.is_dir() else []:
                if child.is_dir():
                    Group(self, [child]).remove()
            try:
                r.rmdir()
            except OSError:
                pass


class Group:
    """One submission's cgroup: `add_current()` (in a child before exec), `kill()`, `oom_kills()`, `remove()`."""

    def __init__(self, owner: Cgroups, dirs: list[Path]):
        self.owner, self.dirs = owner, dirs
        for d in dirs:
            d.mkdir(exist_ok=True)
        mem, pids = owner.memory_bytes, owner.max_processes
        if owner.kind == "v2":
            d = dirs[0]
            if mem:
                (d / "memory.max").write_text(str(mem))
                if (d / "memory.swap.max").exists():
                    (d / "memory.swap.max").write_text("0")
            if pids:
                (d / "pids.max").write_text(str(pids))
        else:
            memd, pidd = dirs
            if mem:
                (memd / "memory.limit_in_bytes").write_text(str(mem))
                if (memd / "memory.memsw.limit_in_bytes").exists():
                    try:
                        (memd / "memory.memsw.limit_in_bytes").write_text(str(mem))
                    except OSError:
                        pass
            if pids:
                (pidd / "pids.max").write_text(str(pids))

    def add_current(self) -> None:
        pid = str(os.getpid())
        for d in self.dirs:
            with open(d / "cgroup.procs", "w") as f:
                f.write(pid)

    def pids(self) -> list[int]:
        out = set()
        for d in self.dirs:
            try:
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(out)

    def kill(self) -> None:
        """SIGKILL every process of the group (a fork bomb included: forks are bounded by pids.max)."""
        if self.owner.kind == "v2" and (self.dirs[0] / "cgroup.kill").exists():
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
            except OSError:
                pass
        for _ in range(200):
            left = self.pids()
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the group's memory limit."""
        d = self.dirs[0]
        name = "memory.events" if self.owner.kind == "v2" else "memory.oom_control"
        try:
            for line in (d / name).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
            if self.owner.kind == "v1":
                return 1 if int((d / "memory.failcnt").read_text()) > 0 and "under_oom 1" in \
                    (d / "memory.oom_control").read_text() else 0
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        self.kill()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _is_checkout(p: Path) -> bool:
    """A folder holding a course (its notebooks, its git data): never bound into the sandbox. (A
    site-packages folder with an installed `tinytorch` is bound, with that package masked: see bwrap_args.)"""
    return (p / "modules").is_dir() or (p / ".git").exists() or (p / "settings.ini").is_file()


def python_paths(with_tito: bool = True) -> list[Path]:
    """What the worker's interpreter needs to start: the venv (sys.prefix), the base installation, the
    interpreter binary's real location, the folders on sys.path (a .pth file may add some), and (unless
    grading binds its own copy of the code it needs) tito's own code; never a course checkout itself."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent,
             *([Path(__file__).resolve().parent] if with_tito else [])]
    for entry in sys.path:
        if not entry or not os.path.isabs(entry) or not os.path.isdir(entry):
            continue
        p = Path(entry).resolve()
        shared = {Path(x) for x in ("/", "/tmp", "/var/tmp", "/dev/shm", "/home", "/root", tempfile.gettempdir())}
        if not _is_checkout(p) and p not in shared and p != Path.home() and p != Path.cwd().resolve():
            paths.append(p)
    out: list[Path] = []
    for p in paths:
        p = p.resolve() if p.exists() else p
        if not any(p == q or q in p.parents for q in out):
            out = [q for q in out if p not in q.parents] + [p]
    return out


@dataclass
class Sandbox:
    mode: str  # bwrap | namespace | none
    hidden: list[Path] = field(default_factory=list)  # namespace mode: covered by empty mounts
    notes: list[str] = field(default_factory=list)  # what was set up (printed once per run)
    memory_bytes: int = 0
    max_processes: int = 256
    tmp_bytes: int = 1 << 30
    uids: list[int] = field(default_factory=list)  # one per worker slot (root only)
    # namespace mode: False when the course or its Python environment lives under /tmp: a private /tmp
    # would hide them, so /dev/shm (private all the same) becomes the submission's folder
    private_tmp: bool = True
    # namespace mode: False cuts the network (`unshare --net`; bwrap always does). Grading keeps it: the
    # notebook's kernel talks to nbclient over localhost. `tito compete`'s worker needs none.
    network: bool = True
    # grading: the copy of the tito code its processes may see (tito.trusted.code_tree), bound read-only at
    # CODE_MOUNT under bwrap; every process starts from it in isolated mode (`isolated`). None: the course's tito
    code_root: Path | None = None
    cgroups: "Cgroups | None" = None  # limits per submission, when the machine has them (grading)

    def isolated(self, module: str, slot: int = 0, chdir: str | None = None) -> list[str]:
        """The command line that starts `python -I` running `module` from the code tree in this sandbox: no
        writable folder on sys.path, no PYTHONPATH; the working directory is `chdir` (inside the sandbox; by
        default the read-only code tree, which the student cannot write)."""
        root = self.code_mount()
        return self._inside([sys.executable, "-I", "-c", BOOT, root, module], slot, chdir=chdir or root,
                            ns_workdir=chdir or root)

    def code_mount(self) -> str:
        """Where the code tree is inside the sandbox."""
        if self.code_root is None:
            return str(Path(__file__).resolve().parent.parent)
        return CODE_MOUNT if self.mode == "bwrap" else str(self.code_root)

    def close(self) -> None:
        """Remove this run's cgroups (its user ids stay leased to the process until it ends)."""
        if self.cgroups is not None:
            self.cgroups.close()

    @property
    def drops_user(self) -> bool:
        return self.mode in ("bwrap", "namespace") and os.geteuid() == 0

    def describe(self) -> str:
        who = (f"as an unprivileged user id ({self.uids[0]}..{self.uids[-1]}, one per worker, leased to this run "
               "alone; no account created)" if self.drops_user and self.uids else "as you")
        limits = self.cgroups.describe() if self.cgroups is not None else \
            f"at most {self.max_processes} processes per submission"
        if self.mode == "bwrap":
            code = f" and of tito's grading code at {CODE_MOUNT}" if self.code_root is not None else ""
            return (f"sandbox bwrap: student code runs {who} in bubblewrap: it sees only read-only binds of "
                    f"{', '.join(str(p) for p in self._python_paths())}{code} and the system's /usr, "
                    f"a private /tmp, no network, its own PID namespace; {limits}")
        if self.mode == "namespace":
            return (f"sandbox namespace: student code runs {who} in its own mount and PID namespaces; "
                    f"hidden from it: {', '.join(str(p) for p in self.hidden)}; the rest of the file system "
                    f"stays readable; {limits}")
        return ("sandbox none: student code runs as you (see the README's instructor loop section); "
                f"it gets its own working directory and HOME outside the course tree; {limits}")

    def _python_paths(self) -> list[Path]:
        """`python_paths` for this sandbox, resolved once per code tree (building the bwrap command for each slot,
        and describing the sandbox, resolved every path of sys.path again)."""
        key = (self.code_root is None, tuple(sys.path))
        cached = self.__dict__.get("_paths")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_paths"] = (key, python_paths(self.code_root is None))
        return list(cached[1])

    def _uid(self, slot: int) -> int:
        return self.uids[slot % len(self.uids)]

    def command(self, module: str, slot: int = 0, ro: tuple = (), rw: tuple = (), chdir: str | None = None) -> list[str]:
        """The command line that starts `python -m module` in this sandbox (the course's tito on PYTHONPATH: `tito
        compete`'s worker). bwrap only: `ro` and `rw` are host paths bound read-only / writable at the same path
        (or (host path, path inside) pairs), `chdir` the working directory."""
        return self._inside([sys.executable, "-m", module], slot, ro, rw, chdir)

    def _inside(self, cmd: list[str], slot: int, ro: tuple = (), rw: tuple = (), chdir: str | None = None,
                ns_workdir: str | None = None) -> list[str]:
        """`cmd` wrapped to run in this sandbox as the user id of `slot` (namespace mode: in `ns_workdir`)."""
        if self.mode == "none":
            return cmd
        drop = []
        if self.drops_user:
            uid = self._uid(slot)
            drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", "--"]
        if self.mode == "namespace":
            uid = self._uid(slot) if self.drops_user else os.getuid()
            script, workdir = (_NS_SCRIPT_CD, [ns_workdir]) if ns_workdir else (_NS_SCRIPT, [])
            return ["unshare", "--mount", "--pid", *([] if self.network else ["--net"]), "--fork", "--kill-child",
                    "--mount-proc", "--propagation", "private", "--", "/bin/sh", "-c", script, "tinytorch-sandbox",
                    str(uid), str(uid), str(self.tmp_bytes), "1" if self.private_tmp else "0", *workdir,
                    *[str(p) for p in self.hidden], "--", *cmd]
        return [*self.bwrap_args(ro, rw, chdir), "--", *drop, *cmd]

    def bwrap_args(self, ro: tuple = (), rw: tuple = (), chdir: str | None = None) -> list[str]:
        args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--hostname", "tinytorch-grading"]
        if os.geteuid() != 0:
            args.append("--unshare-user")
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = Path("/") / top
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), str(p)]
            elif p.is_dir():
                args += ["--ro-bind", str(p), str(p)]
        args += ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
                 "--perms", "1777", "--tmpfs", "/dev/shm", "--perms", "1777", "--dir", "/var/tmp"]
        for name in _ETC:
            p = Path("/etc") / name
            if p.exists():
                args += ["--ro-bind", str(p.resolve()), str(p)]
        made: set[Path] = set()
        if self.code_root is not None:
            args += ["--perms", "0755", "--dir", str(Path(CODE_MOUNT).parent), "--ro-bind", str(self.code_root),
                     CODE_MOUNT]
            made.add(Path(CODE_MOUNT).parent)
        for p in self._python_paths():
            if str(p).startswith("/usr/"):
                continue
            for parent in reversed(p.parents):  # folders bwrap makes on the way are mode 700 unless told
                if parent != Path("/") and parent not in made and str(parent) not in ("/tmp", "/usr"):
                    args += ["--perms", "0755", "--dir", str(parent)]
                    made.add(parent)
            args += ["--ro-bind", str(p), str(p)]
        for p in self._python_paths():  # an installed course package (pip install ., not -e) is hidden: the
            for pkg in (p / "tinytorch", p / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"  # kernel
                        / "site-packages" / "tinytorch"):  # imports only the prerequisite copy
                if pkg.is_dir() and not pkg.is_symlink():
                    args += ["--tmpfs", str(pkg)]
        for binds, how in ((ro, "--ro-bind"), (rw, "--bind")):
            for p in binds:  # a path, or (host path, path in the sandbox)
                src, p = (Path(p[0]), Path(p[1])) if isinstance(p, tuple) else (Path(p).resolve(), Path(p).resolve())
                for parent in reversed(p.parents):
                    if parent != Path("/") and parent not in made and str(parent) not in ("/tmp", "/usr"):
                        args += ["--perms", "0755", "--dir", str(parent)]
                        made.add(parent)
                args += [how, str(src), str(p)]
        args += ["--chdir", chdir or "/tmp", "--setenv", "TMPDIR", "/tmp"]
        return args

    def private_base(self) -> str:
        """The sandbox's private scratch folder, as its processes see it (namespace mode with the course under /tmp:
        /dev/shm)."""
        return "/tmp" if self.mode == "bwrap" or self.private_tmp else "/dev/shm"

    def workdir_base(self) -> str:
        # inside the sandbox /tmp (or /dev/shm, see private_tmp) is a fresh private tmpfs
        if self.mode == "bwrap":
            return "/tmp/tinytorch-grading"
        if self.mode == "namespace":
            return "/tmp/tinytorch-grading" if self.private_tmp else "/dev/shm/tinytorch-grading"
        return ""

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
        # the worker imports tito from where this process did (its folder is bound in the bwrap sandbox)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        if self.mode != "none":  # the sandbox user id has no account: no home directory to look up
            env["USER"] = "grader"
            env["HOME"] = "/tmp" if self.mode == "bwrap" or self.private_tmp else "/dev/shm"
        if self.mode == "namespace" and not self.private_tmp:
            env["TMPDIR"] = "/dev/shm"
        return env

    def _nproc(self) -> int:
        nproc = self.max_processes
        if not self.drops_user and nproc:  # the limit counts all of this user's processes: allow for those running now
            import psutil

            mine = os.getuid()
            nproc += sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == mine)
        return nproc

    def launcher(self, group: "Group | None" = None) -> list[str] | None:
        """The command prefix that does what `preexec` does, in the child, after exec: join the cgroup (`/bin/sh`),
        die with tito (util-linux `setpriv --pdeathsig`), the resource limits (util-linux `prlimit`); its own session
        is Popen's `start_new_session`. Started so, Popen takes its fast path (vfork and exec) instead of a full copy
        of tito's process for a function to run before exec (about 6 ms of tito's process per start). None where
        those tools are missing or too old (then `preexec`)."""
        if not sys.platform.startswith("linux"):
            return None
        tools = self.__dict__.get("_tools")
        if tools is None:
            setpriv, prlimit = (shutil.which(t) for t in ("setpriv", "prlimit"))
            try:  # util-linux before 2.33 (RHEL 8) has no --pdeathsig
                if setpriv is not None and "--pdeathsig" not in subprocess.run(
                        [setpriv, "--help"], capture_output=True, text=True, timeout=30).stdout:
                    setpriv = None
            except (OSError, subprocess.SubprocessError):
                setpriv = None
            tools = self.__dict__["_tools"] = (setpriv, prlimit)
        setpriv, prlimit = tools
        if setpriv is None or prlimit is None:
            return None
        nproc = self._nproc()
        fsize = 1 << 30
        limits = [prlimit, f"--fsize={fsize}:{fsize}", "--core=0:0"]
        if self.memory_bytes:
            limits.append(f"--as={self.memory_bytes}:{self.memory_bytes}")
        if nproc:
            limits.append(f"--nproc={nproc}:{nproc}")
        prefix = [setpriv, "--pdeathsig", "KILL", "--", *limits, "--"]
        if group is not None:
            prefix = ["/bin/sh", "-c", _JOIN_CGROUP, "tito-cgroup", *[str(d / "cgroup.procs") for d in group.dirs],
                      "--", *prefix]
        return prefix

    def preexec(self, group: "Group | None" = None):
        """What runs in the child before exec: its cgroup (`group`: the submission's), its own session, the
        resource limits, and death with tito (where `launcher` cannot: it does the same without a full fork)."""
        memory, nproc = self.memory_bytes, self._nproc()

        libc = None
        if sys.platform.startswith("linux"):  # loaded here: the child of a threaded process only calls it
            import ctypes

            libc = ctypes.CDLL(None)

        def limits():
            if group is not None:
                group.add_current()
            os.setsid()  # its own process group: a Ctrl-C in the terminal reaches tito only
            if memory:
                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            fsize = 1 << 30
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if nproc and hasattr(resource, "RLIMIT_NPROC"):
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            if libc is not None:
                libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with tito

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


def bwrap_available() -> str:
    """'' when bubblewrap can be used here, else why not."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (`apt-get install bubblewrap`)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "`setpriv` (util-linux) is not installed: needed to leave root inside bubblewrap"
    probe = subprocess.run(["bwrap", *(["--unshare-user"] if os.geteuid() != 0 else []), "--unshare-pid",
                            "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs",
                            "/tmp", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here ({probe.stderr.strip() or probe.returncode})"
    return ""


def namespace_available() -> str:
    """'' when the namespace sandbox can be used here, else why not."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.geteuid() != 0:
        return "tito is not running as root (needed to switch to the sandbox user)"
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"`{tool}` (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                            "/bin/sh", "-c", "mount -t tmpfs probe /tmp"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this machine does not allow mount namespaces ({probe.stderr.strip() or probe.returncode})"
    return ""


def make_sandbox(mode: str, hidden: list[Path], root: Path, memory_bytes: int, workers: int = 1,
                 max_processes: int = 256, setting: str = "[grading] sandbox =", needed: tuple = ()) -> Sandbox:
    """The sandbox for this run; `mode` is settings.ini's auto | bwrap | namespace | none. `setting`: how
    errors name the choice (`--sandbox` for tito compete); `needed`: more paths the worker must see
    (namespace mode: /tmp is private only when none of them lies under it)."""
    if mode not in MODES:
        if setting.startswith("["):
            raise CourseError(f"settings.ini: {setting} {mode!r} must be one of {', '.join(MODES)}")
        raise CourseError(f"{setting} {mode!r} must be one of {', '.join(MODES)}")
    kw = dict(memory_bytes=memory_bytes, max_processes=max_processes,
              uids=_free_uids(max(1, workers)) if os.geteuid() == 0 else [])
    if mode == "none":
        return Sandbox("none", **kw)
    notes = []
    for candidate, check in (("bwrap", bwrap_available), ("namespace", namespace_available)):
        if mode not in ("auto", candidate):
            continue
        why_not = check()
        if why_not:
            if mode == candidate:
                raise CourseError(f"{setting} {candidate} cannot be used: {why_not}")
            notes.append(f"{candidate} not used: {why_not}")
            continue
        if candidate == "bwrap":
            return Sandbox("bwrap", notes=notes, **kw)
        paths = [p for p in [*hidden, *_git_dirs(root)] if p.exists()]
        needed = [Path(sys.prefix), Path(sys.executable).resolve(), Path(__file__).resolve().parent, root, *needed]
        private_tmp = not any(Path("/tmp") in p.resolve().parents for p in needed) or not Path("/dev/shm").is_dir()
        if not private_tmp:
            notes.append("the course or its Python lives under /tmp, so /tmp stays the host's; each submission "
                         "works in its own private /dev/shm instead")
        return Sandbox("namespace", hidden=paths, notes=notes, private_tmp=private_tmp, **kw)
    box = Sandbox("none", **kw)
    box.notes.append(f"no sandbox ({'; '.join(notes)}); student code runs with your permissions")
    return box


# ------------------------------------------------------------------ preflight


def _unreachable(path: Path) -> Path | None:
    """The first folder on the way to `path` that a user other than its owner cannot enter (mode 700 and such)."""
    p = Path("/")
    for part in path.parts[1:]:
        try:
            st = os.stat(p)
        except OSError:
            return p
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            return p
        p = p / part
    return None


@dataclass
class Trial:
    """One worker a run will start, tried once before any submission: started as the run starts it (`start(log)`:
    its stderr to the open file `log`), given a job of the job protocol (tito.jobs), its result judged by `check`
    ('' or one line: the cause and the fix). `what` names it; `none` says how to run without the sandbox (`run with
    --sandbox none`), `bwrap` the setting that chooses bubblewrap."""
    what: str
    kind: str
    payload: dict
    start: Callable
    check: Callable[[dict], str] | None = None
    then: tuple = ()  # the job's own messages, sent after it (the probe runner's `exit`)
    none: str = "run `tito nbgrader autograde` with `[grading] sandbox = none`"
    bwrap: str = "`[grading] sandbox = bwrap`"


def diagnose(box: Sandbox, detail: str, trial: Trial | None = None) -> str:
    """One line: why the worker (`trial`'s; grading's by default) did not start in `box`, and the fix."""
    what = trial.what if trial else "the grading worker"
    none = trial.none if trial else Trial.none
    bwrap = trial.bwrap if trial else Trial.bwrap
    if box.drops_user and box.mode == "namespace":
        for part, p in (("the interpreter", Path(sys.executable)), ("the interpreter's real file",
                                                                      Path(sys.executable).resolve()),
                        ("the standard library", Path(sys.base_prefix)), ("the virtual environment", Path(sys.prefix)),
                        ("tito's code", Path(__file__).resolve().parent)):
            blocked = _unreachable(p)
            if blocked is not None:
                mode = oct(os.stat(blocked).st_mode & 0o777) if blocked.exists() else "?"
                system = next((q for q in ("/usr/bin/python3", "/usr/local/bin/python3")
                               if os.path.exists(q) and _unreachable(Path(q).resolve()) is None), "")
                fix = ("recreate the course venv from a Python outside it"
                       + (f" (`{system} -m venv .venv`)" if system else "") if part != "tito's code"
                       else "move the course to a folder other users can read")
                return (f"sandbox {box.mode}: {part} ({p}) lies under {blocked} (mode {mode}), which the sandbox "
                        f"user cannot read: {fix}, or use {bwrap} (`apt-get install bubblewrap`), which binds it "
                        "read-only")
    return (f"sandbox {box.mode}: {what} does not start ({detail}); {none} to see whether the sandbox is the cause"
            + (f"; with bubblewrap installed (`apt-get install bubblewrap`) {bwrap} binds what the worker needs "
               "read-only" if box.mode == "namespace" else ""))


def _stamp_key(box: Sandbox, files: dict[str, str]) -> str:
    h = hashlib.sha256()
    args = " ".join(box.bwrap_args() if box.mode == "bwrap" else box.hidden.__repr__())
    if box.code_root is not None:  # a fresh folder each run: its contents count, not its name
        args = args.replace(str(box.code_root), "CODE")
        for f in sorted(box.code_root.rglob("*.py")):
            h.update(f.read_bytes())
    for part in (box.mode, sys.executable, sys.version, str(box.uids[:1]), str(box.memory_bytes),
                 str(box.max_processes), args):
        h.update(part.encode() + b"\0")
    for p in (Path(sys.executable), Path(__file__).with_name("grade_worker.py"), Path(__file__).with_name("jobs.py")):
        try:
            h.update(str(p.stat().st_mtime_ns).encode())
        except OSError:
            pass
    h.update(json.dumps(sorted(files)).encode())
    return h.hexdigest()


def try_worker(box: Sandbox, trial: Trial, timeout: float) -> dict:
    """Start `trial`'s worker and give it its job; its result, or CourseError with one line (`diagnose`)."""
    from . import jobs

    with tempfile.TemporaryFile() as log:
        try:
            reply = jobs.run(trial.start(log), trial.kind, trial.payload, time.monotonic() + timeout + 30,
                             then=trial.then)
        except OSError as e:
            raise CourseError(diagnose(box, f"{type(e).__name__}: {e}", trial)) from None
        log.seek(0)
        err = [ln for ln in log.read()[-4000:].decode("utf-8", "replace").strip().splitlines() if ln.strip()]
    if reply.result is not None:
        why = trial.check(reply.result) if trial.check else ""
        if why:
            raise CourseError(why)
        return reply.result
    if reply.fatal:
        detail = reply.fatal[:200]
    elif reply.ended == "timeout":
        detail = f"no answer within {timeout + 30:g} s"
    else:
        detail = err[-1][:200] if err else f"exit code {reply.code}, no output"
    raise CourseError(diagnose(box, detail, trial))


def grading_trials(box: Sandbox, files: dict[str, str], imports: list[str], timeout: float) -> list[Trial]:
    """Grading's workers: the notebook worker on a one-cell notebook importing `imports` in its kernel (with the
    course package copy `files`), and the probe runner (it must start and import what it needs)."""
    import nbformat

    from . import jobs

    src = "\n".join(["import sys"] + [f"import {m}" for m in imports] + ["print('preflight ok')"])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src)])
    workdir = (f"{box.workdir_base()}/preflight" if box.workdir_base() else tempfile.mkdtemp(prefix="tito-preflight-"))

    def check_notebook(result: dict) -> str:
        if box.mode == "none":
            shutil.rmtree(workdir, ignore_errors=True)
        if result.get("status") != "ok":
            return diagnose(box, f"{result.get('status')}: {result.get('reason')}")
        errors = [o for o in nbformat.reads(result["notebook"], as_version=4).cells[0].get("outputs", [])
                  if o.get("output_type") == "error"]
        if errors:
            e = errors[0]
            return (f"sandbox {box.mode}: the course package does not import in the grading kernel "
                    f"({e.get('ename')}: {e.get('evalue')}): run `tito test` on the prerequisite modules")
        return ""

    trials = [Trial("the grading worker", "grade",
                    {"notebook": nbformat.writes(nb), "files": files, "workdir": workdir, "deadline_s": timeout,
                     "cell_timeout_s": timeout},
                    lambda log: jobs.start(box, "tito.grade_worker", stdout=subprocess.PIPE, stderr=log),
                    check_notebook)]
    if box.code_root is not None:
        def start_probe(log):
            if box.mode == "none":
                return jobs.start(box, "tito.probe_run", stderr=log, cwd=tempfile.mkdtemp(prefix="tito-preflight-"))
            return jobs.start(box, "tito.probe_run", stderr=log, chdir=box.private_base())

        # a job with no exercises: it starts, imports, says `ready`, and ends at the parent's `exit`
        trials.append(Trial("the probe runner", "probe", {"module": "00", "seed": 0, "package_module": "tinytorch",
                                                          "mode": "replay", "files": {}}, start_probe,
                            then=({"t": "exit"},)))
    return trials


def preflight(box: Sandbox, files: dict[str, str] | None = None, imports: list[str] = (), stamp: Path | None = None,
              timeout: float = 120, trials: list[Trial] | None = None) -> float:
    """Start the workers as the run will (sandbox, limits, interpreter; grading's by default: `grading_trials`) and
    give each a job; CourseError with the cause and the fix, in one line, when one fails. The one preflight of
    grading, of each node of a cluster and of `tito compete`.

    Returns the seconds it took (0 when `stamp` says this exact setup passed before)."""
    key = _stamp_key(box, files or {}) if stamp is not None else ""
    if stamp is not None and stamp.exists() and stamp.read_text().strip() == key:
        return 0.0
    t0 = time.monotonic()
    for trial in trials if trials is not None else grading_trials(box, files or {}, list(imports), timeout):
        try_worker(box, trial, timeout)
    if stamp is not None:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(key + "\n")
    return time.monotonic() - t0
