"""SNIPS: intent classification of voice-assistant requests into seven intents.

The narrowest routing workload: a short utterance ("Add this song to my road trip playlist") and
one of seven labels (AddToPlaylist, BookRestaurant, GetWeather, PlayMusic, RateBook,
SearchCreativeWork, SearchScreeningEvent). The data is the 700 validation utterances of Sonos's NLU
benchmark (CC0; ``evals/data/snips``, PROVENANCE.md beside it), 100 per intent. Asked and graded as
Banking77 is (`evals.suites.banking77`): the labels in a system message shared by every item, the
label alone as the answer, compared case-insensitively after trimming.
"""

from __future__ import annotations

import json
from pathlib import Path

from evals.suites.banking77 import Banking77
from evals.suites.base import AnswerKey, Item
from router.generation import Message

DATA = Path(__file__).resolve().parents[1] / "data" / "snips"

SYSTEM = (
    "You classify requests to a voice assistant by intent. Reply with exactly one label from this "
    "list and nothing else:\n{labels}"
)


class Snips(Banking77):
    name = "snips"
    max_tokens = 16
    version = "2"  # 2: Banking77's grader (banking77@3) trims its wrapping in one pass, full stops at either end
    source = "SNIPS NLU benchmark validation set, 7 intents x 100, CC0 (evals/data/snips/PROVENANCE.md)"

    def __init__(self, root: Path = DATA) -> None:
        super().__init__(root)

    def labels(self) -> list[str]:
        return sorted(p.stem.removeprefix("validate_") for p in self.root.glob("validate_*.json"))

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        labels = self.labels()
        system = Message("system", SYSTEM.format(labels="\n".join(labels)))
        items = []
        for label in labels:
            rows = json.loads((self.root / f"validate_{label}.json").read_text(encoding="utf-8"))[label]
            for n, row in enumerate(rows):
                text = "".join(piece["text"] for piece in row["data"]).strip()
                items.append(
                    Item(
                        id=f"snips/{label}/{n}",
                        messages=(system, Message("user", text)),
                        answer_key=AnswerKey(reference=label.lower()),
                        group=label,
                    )
                )
        return items
