"""Config is typed and validated at start-up, with errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.config import DEFAULT_CONFIG, load_settings
from router.engine import check_resources
from router.errors import ConfigError
from tests.support.config import smol_config, smol_settings
from verifiers.base import Registry


def test_default_config_loads() -> None:
    settings = load_settings(DEFAULT_CONFIG)
    assert [t.name for t in settings.tiers] == ["small", "large"]
    assert settings.tiers[0].llamacpp is not None
    assert settings.tiers[0].llamacpp.model == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert settings.tiers[1].price.usd_per_1m_output_tokens is not None


def test_unknown_key_is_refused_naming_it(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("threshold = 0.5", "threshold = 0.5\nthreshhold = 0.7"))
    with pytest.raises(ConfigError, match=r"tiers\[0\] \(small\)\.threshhold"):
        load_settings(cfg)


def test_wrong_type_is_refused_naming_it(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("n_ctx = 2048", 'n_ctx = "big"', 1))
    with pytest.raises(ConfigError, match=r"tiers\[0\] \(small\)\.llamacpp\.n_ctx"):
        load_settings(cfg)


def test_tier_without_price_is_refused(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    text = cfg.read_text()
    start = text.index("[tiers.price]")
    cfg.write_text(text[:start] + text[text.index("\n", text.index("stands_for")) :])
    with pytest.raises(ConfigError, match=r"tiers\[0\] \(small\)\.price: Field required"):
        load_settings(cfg)


def test_price_needs_one_mode(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    cfg.write_text(cfg.read_text().replace("usd_per_hour = 0.10", "usd_per_hour = 0.10\nusd_per_1m_input_tokens = 1.0"))
    with pytest.raises(ConfigError, match=r"price: Value error, set either"):
        load_settings(cfg)


def test_malformed_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[server\nport = 1")
    with pytest.raises(ConfigError, match="invalid config"):
        load_settings(cfg)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")


def test_missing_model_is_reported_with_its_key(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    cfg.write_text(cfg.read_text().replace('model = "smollm2-135m-instruct-q4_1"', f'model = "{tmp_path}/absent.gguf"'))
    problems = check_resources(load_settings(cfg), Registry())
    assert len(problems) == 1
    assert problems[0].startswith("tiers[0] (small).llamacpp.model: model file not found")


def test_a_missing_or_tampered_prerouter_is_reported_with_its_key(tmp_path: Path) -> None:
    """`tierroute config check` finds it, not only `serve`."""
    cfg = smol_config(tmp_path, large="none")
    section = f'[tiers.prerouter]\nartifact = "{tmp_path}/pre.json"\nsha256 = "{"0" * 64}"\nthreshold = 0.5\n'
    cfg.write_text(cfg.read_text().replace("[tiers.price]", section + "[tiers.price]", 1))
    problems = check_resources(load_settings(cfg), Registry(), skip_models=["small"])
    assert len(problems) == 1 and problems[0].startswith("tiers (small).prerouter: ")
    (tmp_path / "pre.json").write_text("{}")
    problems = check_resources(load_settings(cfg), Registry(), skip_models=["small"])
    assert len(problems) == 1 and "SHA-256" in problems[0]


def test_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERROUTE_SERVER__PORT", "9123")
    settings = smol_settings(tmp_path)
    assert settings.server.port == 9123


def test_duplicate_tier_names(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path)
    cfg.write_text(cfg.read_text().replace('name = "large"', 'name = "small"'))
    with pytest.raises(ConfigError, match="duplicate tier names: small"):
        load_settings(cfg)


def test_an_unregistered_backend_is_reported_with_its_key(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    text = cfg.read_text()
    i = text.index("[tiers.llamacpp]")
    j = text.index("[", text.index("\n", i) + 1)  # the section after it
    cfg.write_text(text[:i].replace('backend = "llamacpp"', 'backend = "llamacp"') + text[j:])
    problems = check_resources(load_settings(cfg), Registry())
    assert problems == ["tiers[0] (small).backend: unknown backend 'llamacp'; known: llamacpp, openai"]


def test_options_belong_to_plugin_backends_only(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    cfg.write_text(cfg.read_text().replace("[tiers.price]", "[tiers.options]\nsize = 1\n[tiers.price]", 1))
    with pytest.raises(ConfigError, match="options are for plugin backends"):
        load_settings(cfg)


def test_the_default_configs_commented_maths_policies_are_valid(tmp_path: Path) -> None:
    """config.toml shows, commented, the maths policies the README's figures come from: each, with
    its leading `#   ` taken off, makes a config that loads, and its verifiers build."""
    from router.verification import VerifierContext

    text = DEFAULT_CONFIG.read_text()
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line == "#   [tiers.tasks.maths]":
            block = []
            for follow in lines[i:]:
                if not follow.startswith("#   ") or follow.startswith("#   ("):
                    break
                block.append(follow[4:])
            blocks.append(block)
    assert len(blocks) == 2, blocks  # the cross_tier policy and the weighted mean
    anchor = "# Code: the prompt's own examples"
    registry = Registry.from_entry_points()
    # each replaces the maths policy in force (its table, up to the next task's comments)
    start, end = text.index("\n[tiers.tasks.maths]\n"), text.index(anchor)
    assert [v.name for v in load_settings(DEFAULT_CONFIG).tiers[0].tasks["maths"].verifiers] == [
        "arithmetic",
        "confidence",
    ]
    for block in blocks:
        cfg = tmp_path / "config.toml"
        cfg.write_text(text[:start] + "\n" + "\n".join(block) + "\n\n" + text[end:])
        policy = load_settings(cfg).tiers[0].tasks["maths"]
        assert policy.verifiers, block
        for spec in policy.verifiers:
            registry.create(spec.name, spec.params, VerifierContext(tier="small"))


@pytest.mark.parametrize(
    ("sandbox", "key"),
    [
        ("max_concurrency = -1", "sandbox.max_concurrency"),
        ("max_concurrency = 100000", "sandbox.max_concurrency"),
        ('max_concurrency = "all"', "sandbox.max_concurrency"),
        ("max_queue = -5", "sandbox.max_queue"),
        ("max_queue = 1e12", "sandbox.max_queue"),
        ("max_concurency = 2", "sandbox.max_concurency"),
    ],
)
def test_bad_sandbox_limits_are_refused_naming_the_key(tmp_path: Path, sandbox: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        smol_settings(tmp_path, sandbox=sandbox)


def test_sandbox_limits_default_to_the_cpu_count_and_four_waiting_per_slot(tmp_path: Path) -> None:
    import os

    default = smol_settings(tmp_path).sandbox
    assert default.slots == (os.cpu_count() or 2) and default.queue == 4 * default.slots
    set_ = smol_settings(tmp_path, sandbox="max_concurrency = 3\nmax_queue = 1").sandbox
    assert (set_.slots, set_.queue) == (3, 1)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1:5432/db?passwor%64=s3cret",
        "postgresql://u@127.0.0.1:5432/db?%70assword=s3cret",
        "postgresql://u@127.0.0.1:5432/db?user=u&passwor%64=s3cret",
        "postgresql://u@127.0.0.1:5432/db?sslpassword=s3cret",
        "postgresql://u:s3cret@127.0.0.1:5432/db",
        "postgresql://u@127.0.0.1:5432/db?s3cret",  # libpq cannot read it: refused without quoting it
        "postgresql://u:s3cret@[::1/db",  # not a URL at all (an unclosed bracket): refused, not raised
    ],
)
def test_a_password_in_the_ledger_url_is_refused_however_spelled_and_never_echoed(tmp_path: Path, url: str) -> None:
    # the attack review's finding: the check looked for the literal `password=`, while libpq decodes
    # percent-encoded keywords, so `passwor%64=s3cret` put a password in the config unrefused; and
    # a refused URL was quoted back in the error, secret and all
    from router.ledger.stores import open_store

    cfg = smol_config(tmp_path)
    cfg.write_text(cfg.read_text().replace(f'path = "{tmp_path / "ledger.sqlite3"}"', f'url = "{url}"'))
    with pytest.raises(ConfigError, match=r"ledger\.url") as config_error:
        load_settings(cfg)
    with pytest.raises(ConfigError, match=r"ledger\.url") as store_error:
        open_store(url)  # a location given on the command line (reports, `tierroute ledger`)
    for err in (config_error, store_error):
        assert "s3cret" not in str(err.value)
        assert "password" in str(err.value) or "libpq" in str(err.value)


def test_a_ledger_url_without_a_password_still_loads(tmp_path: Path) -> None:
    cfg = smol_config(tmp_path)
    plain = "postgresql://u@127.0.0.1:5432/db?sslmode=disable&application_name=x"
    cfg.write_text(cfg.read_text().replace(f'path = "{tmp_path / "ledger.sqlite3"}"', f'url = "{plain}"'))
    assert load_settings(cfg).ledger.url == plain
