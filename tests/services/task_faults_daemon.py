"""The PySpark daemon of the tests' Spark session: ``pyspark.daemon``, except that every Python
worker it forks first installs the tests' task hooks (:class:`task_faults.FirstAttemptFails`).

The session names it in ``spark.python.daemon.module`` and puts this folder on the workers'
``PYTHONPATH`` (:func:`spark_conf`). It imports nothing but the standard library and
PySpark's daemon before forking: the daemon must start no threads (pyarrow would).
"""

from __future__ import annotations

import os
import socket

MODULE = "task_faults_daemon"
FOLDER = os.path.dirname(os.path.abspath(__file__))


def spark_conf() -> dict[str, str]:
    """The Spark settings that run the workers through this daemon."""
    return {"spark.python.daemon.module": MODULE}


def workers_path(path: str | None) -> str:
    """``PYTHONPATH`` for the workers: this folder, then ``path``."""
    return os.pathsep.join([FOLDER, *([path] if path else [])])


def _main() -> None:
    import pyspark.daemon as daemon

    forked_worker = daemon.worker

    def worker(sock: socket.socket, authenticated: bool) -> int:
        # After the fork: imports that start threads are safe here.
        from task_faults import FirstAttemptFails

        from icefloe.spark.tasks import install_task_hooks

        install_task_hooks(FirstAttemptFails())
        return forked_worker(sock, authenticated)

    daemon.worker = worker
    daemon.manager()


if __name__ == "__main__":
    _main()
