"""The progress of an eval on the console: one bar per tier, with its rate and the time left.

Apart from the commands so the runner never knows how it is shown: it calls `start`, `advance`
and `finish` of the `Progress` protocol (`evals.runner`) and runs silent without one; `eval run`
and its mixed suite pass this one. rich is imported only when the bars are made.
"""

from __future__ import annotations

from typing import Any


class RichProgress:
    """One bar per tier: items done, rate and time left."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        class Rate(TextColumn):
            def __init__(self) -> None:
                super().__init__("")

            def render(self, task: Any) -> Any:
                from rich.text import Text

                speed = task.finished_speed or task.speed
                return Text(
                    "–/s" if not speed else (f"{speed:.2f} items/s" if speed >= 0.1 else f"{60 * speed:.2f} items/min")
                )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            Rate(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, tier: str, total: int, cached: int) -> None:
        label = f"{tier}" + (f" ({cached} cached)" if cached else "")
        self.tasks[tier] = self.progress.add_task(label, total=total)

    def advance(self, tier: str) -> None:
        self.progress.advance(self.tasks[tier])

    def finish(self, tier: str) -> None:
        self.progress.refresh()
