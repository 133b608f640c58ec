"""A stage plugin installed the way a user installs one: a distribution on the path whose entry
point joins the group ``tierroute.stages``, named in the config, served by `tierroute serve` on
the test model and called with the official `openai` client. It runs on every request, of both
completion surfaces, streamed and not, and what it says reaches the client.
"""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from tests.support.config import smol_config
from tests.support.servers import serve_process

pytestmark = pytest.mark.slow

PLUGIN = '''
from router.pipeline import Stage, StageRefused


class Counter(Stage):
    """Counts the requests it sees, refuses any that says `marker`."""

    def __init__(self, params):
        self.marker = params.pop("marker")
        super().__init__(params)
        self.seen = 0

    async def before(self, ctx):
        self.seen += 1
        text = ctx.request.prompt if ctx.request.prompt is not None else ctx.request.messages[-1].content
        if self.marker in text:
            raise StageRefused(self.name, "refused by the demo plugin")
        ctx.notes[self.name] = {"seen": self.seen, "surface": ctx.surface}

    async def after(self, ctx, result):
        ctx.notes[self.name]["tier"] = result.final.tier


def register_stages(register):
    register("demo_counter", Counter)
'''


def install_plugin(site: Path) -> None:
    """A distribution as pip leaves one in site-packages: the module and its dist-info."""
    site.mkdir()
    (site / "tr_demo_stage.py").write_text(PLUGIN)
    info = site / "tr_demo_stage-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tr-demo-stage\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tierroute.stages]\ndemo = tr_demo_stage:register_stages\n")


def test_an_installed_stage_plugin_runs_on_every_request(tmp_path: Path, smol_path: Path) -> None:
    install_plugin(tmp_path / "site")
    cfg = smol_config(tmp_path, large="none")
    cfg.write_text(cfg.read_text() + '\n[[stages]]\nname = "demo_counter"\nparams = { marker = "XYZZY" }\n')
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p)
    with serve_process(cfg, log_path=tmp_path / "serve.log", env={"PYTHONPATH": path}) as (_, url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        ask = [{"role": "user", "content": "Say hi."}]
        chat = client.chat.completions.create(model="auto", messages=ask, max_tokens=4)  # type: ignore[arg-type]
        legacy = client.completions.create(model="auto", prompt="Say hi.", max_tokens=4)
        with client.chat.completions.create(model="auto", messages=ask, max_tokens=4, stream=True) as stream:  # type: ignore[arg-type]
            chunks = list(stream)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "XYZZY"}], max_tokens=4)
    seen = [
        chat.model_extra["tierroute"]["stages"]["demo_counter"],  # type: ignore[index]
        legacy.model_extra["tierroute"]["stages"]["demo_counter"],  # type: ignore[index]
        chunks[-1].model_extra["tierroute"]["stages"]["demo_counter"],  # type: ignore[index]
    ]
    assert [s["seen"] for s in seen] == [1, 2, 3]
    assert [s["surface"] for s in seen] == ["chat.completions", "completions", "chat.completions"]
    assert all(s["tier"] == "small" for s in seen)
    assert refused.value.status_code == 400 and refused.value.code == "refused_by_demo_counter"
