"""Imported first in the engine core's forkserver (cluster.engines.forkserver): it claims the room for a
process title before anything else in the server can change the environment.

setproctitle writes a title over the memory of the process's argv and environment, which it finds on its first
call by walking back from the first environment string. Once that variable has been changed (an import that
sets it: OpenCV's, imported with vLLM, prepends to LD_LIBRARY_PATH), the string lives elsewhere, setproctitle finds no room, and every
later title is silently dropped: the forked engine core would keep the server's command line and name, and the
GPU pinning, which finds the engine core by name, would miss it. Which variable comes first depends on the
machine's environment. Asking for the title here, before the other preloads, sets setproctitle up while the
environment is still as the process started; the forked engine cores inherit that set-up.
"""

from __future__ import annotations

import contextlib

with contextlib.suppress(ImportError):
    import setproctitle

    setproctitle.getproctitle()
