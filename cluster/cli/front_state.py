"""What the warm CLI server (cluster.cli.front_server) imported and the process it is, as they were when it
started; and whether a client's command, forked from it, would be the process that command would be started
from nothing: the same interpreter, flags, limits, namespaces and cgroup, the same environment (shell and
terminal bookkeeping aside), an import path whose first entry holds no other copy of its packages, a working
directory and CPUs it can take, and its imported files unchanged on disk."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from cluster.cli.front_paths import process_traits

# Variables a shell or terminal keeps per window or per directory, which no module reads as it is imported:
# the command's process takes the client's values of them all the same.
BOOKKEEPING = frozenset({
    "_", "PWD", "OLDPWD", "SHLVL", "COLUMNS", "LINES", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "TMUX_PANE",
    "WINDOWID", "TERM_SESSION_ID", "ITERM_SESSION_ID", "KONSOLE_DBUS_WINDOW", "VTE_VERSION",
})  # fmt: skip


@dataclass
class CodeState:
    """What the server imported, as it was on disk when it started, and the process it was then."""

    files: dict[str, tuple[int, int]]  # module file -> (mtime_ns, size)
    packages: dict[str, str]  # top-level module name -> the folder or file it was imported from
    env: dict[str, str]  # the environment before the imports, which a client's must equal
    set_by_imports: dict[str, str]  # what the imports set in it (`import ray`: RAY_CLIENT_MODE, ...)
    path: list[str]  # sys.path before the imports, which a client's must equal but for its first entry
    path_after: list[str]  # sys.path after them (`import ray` adds its third-party folder)
    traits: dict  # front_paths.process_traits(), as JSON carries it

    @classmethod
    def after_imports(cls, modules: tuple[str, ...], then: Callable[[], None] = lambda: None) -> CodeState:
        """Import `modules`, call `then` (what loads more on first use), and record the state they left. The
        environment is the one the imports left: what `then` loads would set its variables in a fresh process
        only when that process loads it (lm-eval's import sets HF_XET_HIGH_PERFORMANCE), so they are undone."""
        env, path = dict(os.environ), list(sys.path)
        for name in modules:
            importlib.import_module(name)
        imported_env = dict(os.environ)
        try:
            then()
        finally:
            for name in set(os.environ) - set(imported_env):
                del os.environ[name]
            os.environ.update(imported_env)
        set_by_imports = {k: v for k, v in os.environ.items() if env.get(k) != v}
        files, packages = {}, {}
        for name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None)
            if not origin or not os.path.isabs(origin):
                continue
            try:
                info = os.stat(origin)
            except OSError:
                continue
            files[origin] = (info.st_mtime_ns, info.st_size)
            if "." not in name:
                is_package = os.path.basename(origin).startswith("__init__.")
                packages[name] = os.path.dirname(origin) if is_package else origin
        traits = json.loads(json.dumps(process_traits()))
        return cls(files, packages, env, set_by_imports, path, list(sys.path), traits)

    def changed(self) -> list[str]:
        """Imported files that changed (or went) since the server started."""
        found = []
        for path, (mtime_ns, size) in self.files.items():
            try:
                info = os.stat(path)
            except OSError:
                found.append(path)
                continue
            if (info.st_mtime_ns, info.st_size) != (mtime_ns, size):
                found.append(path)
        return found

    def refusal(self, request: dict) -> str | None:
        """Why a command's process forked from here would differ from one started from nothing; None if not."""
        if request.get("executable") != sys.executable:
            return f"another interpreter ({request.get('executable')})"
        differ = self.env_differs(request.get("env", {}))
        if differ:
            return f"the environment differs in {', '.join(differ)}"
        traits = request.get("process", {})
        unlike = sorted(key for key in self.traits if traits.get(key) != self.traits[key])
        if unlike:
            return f"the process differs in its {', '.join(unlike)}"
        return self.path_refusal(request) or self.place_refusal(request)

    def env_differs(self, env: dict[str, str]) -> list[str]:
        """Variables whose values differ, by name only. A client that already has what the imports would set
        (a process that imported Ray: RAY_CLIENT_MODE) differs in nothing there."""
        return sorted(
            name
            for name in set(env) | set(self.env)
            if name not in BOOKKEEPING
            and env.get(name) != self.env.get(name)
            and not (name in self.set_by_imports and env.get(name) == self.set_by_imports[name])
        )

    def path_refusal(self, request: dict) -> str | None:
        path = request.get("path", [])
        if path[1:] != self.path[1:]:
            return "another import path (sys.path)"
        first = os.path.join(request.get("cwd", "/"), path[0]) if path else ""
        if first and os.path.realpath(first) != os.path.realpath(self.path[0] or os.getcwd()):
            shadowed = self.shadowed_by(first)
            if shadowed:
                return f"{first} holds other copies of {', '.join(shadowed)}"
        return None

    def place_refusal(self, request: dict) -> str | None:
        if not os.path.isdir(request.get("cwd", "")):
            return f"its working directory {request.get('cwd')} is not one the server can enter"
        if not set(request.get("affinity", [])) <= os.sched_getaffinity(0):
            return "its CPUs are not all the server's"
        return None

    def shadowed_by(self, folder: str) -> list[str]:
        """Top-level modules the server imported that `folder`, first on a client's path, has other copies of
        (a regular package or a module file: a folder without `__init__` does not shadow one found later)."""
        suffixes = importlib.machinery.all_suffixes()
        found = []
        for name, origin in self.packages.items():
            base = os.path.join(folder, name)
            candidates = [base] if os.path.exists(os.path.join(base, "__init__.py")) else []
            candidates += [base + suffix for suffix in suffixes if os.path.exists(base + suffix)]
            if any(os.path.realpath(c) != os.path.realpath(origin) for c in candidates):
                found.append(name)
        return found

    def command_view(self, request: dict) -> dict:
        """The request as the command's process takes it on: the client's environment and import path with
        what the server's imports added to them, as the command's own imports would have."""
        first = request["path"][0] if request["path"] else ""
        path = [first if entry == self.path[0] else entry for entry in self.path_after]
        return {**request, "env": {**request["env"], **self.set_by_imports}, "path": path}
