"""What one command printed on one node: the SSH connector's answer (`sparkctl.nodes.ssh`), kept apart so that the
facts, the runtimes and the tests read it without the connector."""
from __future__ import annotations

from dataclasses import dataclass

from sparkctl.errors import CommandFailed


@dataclass(frozen=True)
class CommandResult:
    """What one command printed on one node (argv and output already redacted)."""

    node: str
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        """stdout then stderr, for evidence."""
        return self.stdout + (("\n" if self.stdout and not self.stdout.endswith("\n") else "") + self.stderr
                              if self.stderr else "")

    def check(self) -> CommandResult:
        """Raise CommandFailed (argv, exit code, output tail) unless the command exited 0."""
        if self.returncode != 0:
            raise CommandFailed(node=self.node, argv=self.argv, returncode=self.returncode, output=self.output)
        return self
