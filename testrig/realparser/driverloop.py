"""The end of every real-parser driver (driver.py, vllm_driver.py): appended to the driver's text by
testrig.realparser._Server, run as ``python -c TEXT PREFIX [serve]`` in the engine's venv. The driver's globals
hold PREFIX, SERVE, req, emit and answer(request); in serve mode this loop answers one request per stdin line, each
in a child forked from the imported state, its printed output returned beside the answer; else the one request."""
import json
import os
import sys
import tempfile
import traceback


def _serve(g):
    answer, emit, prefix = g["answer"], g["emit"], g["PREFIX"]
    real_out = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                    emit(answer(request))
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(0)
            os.waitpid(pid, 0)
            out.seek(0)
            err.seek(0)
            reply = {"stdout": out.read().decode("utf-8", "replace"),
                     "stderr": err.read().decode("utf-8", "replace")}
        real_out.write(prefix + json.dumps(reply) + "\n")
        real_out.flush()


def _run(g):
    if g["SERVE"]:
        _serve(g)
    else:
        g["emit"](g["answer"](g["req"]))


_run(globals())
