"""The OpenAI client's API key leaves the process only in the ``Authorization`` header.

It comes from an environment variable or a file. A key given as a value (Python, YAML or command line) is refused,
and in no case does it reach ``config.yaml``, ``--print_config``, error messages, logs, ``repr``, cache keys or cache
files: the CLI tests grep every file a run writes, its stdout/stderr and its log records for the key.
"""

from __future__ import annotations

import logging
import sys
import traceback
import warnings
from pathlib import Path

import lightning as L
import pytest
import yaml
from torch.utils.data import DataLoader

from kglightning.cli import main
from kglightning.llm.backends import ChatCompletionServer, Generation, LLMBackend, LLMHTTPError, OpenAIChatBackend

KEY = "sk-kgl-FAKE-9f3c71e2a5d84b06"
HELLO = [[{"role": "user", "content": "hello"}]]


class Echo(LLMBackend):
    name = "echo"

    def _generate_uncached(self, batch, params, on_result):
        for i, messages in enumerate(batch):
            on_result(i, Generation(text=messages[-1]["content"], completion_tokens=1))


class Questions(L.LightningDataModule):
    """Two one-word questions."""

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(["hello", "bonjour"], batch_size=1)


class ReasonerProbe(L.LightningModule):
    """The smallest CLI run with an LLM backend: one generate call per predict batch."""

    def __init__(self, reasoner: LLMBackend) -> None:
        super().__init__()
        self.reasoner = reasoner

    def predict_step(self, batch: list[str], batch_idx: int) -> list[str]:
        return [g.text for g in self.reasoner.generate([[{"role": "user", "content": q}] for q in batch])]


@pytest.fixture
def server():
    with ChatCompletionServer(Echo(), port=0, api_key=KEY) as srv:
        yield srv


def _assert_no_key_under(folder: Path, *texts: str) -> None:
    for text in texts:
        assert KEY not in text
    files = [p for p in folder.rglob("*") if p.is_file()]
    for path in files:
        assert KEY.encode() not in path.read_bytes(), f"the API key was written to {path}"


def test_key_given_as_a_value_is_refused_without_echo(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY.*api_key_file") as info:
        OpenAIChatBackend("http://127.0.0.1:9/v1", api_key=KEY)
    assert KEY not in str(info.value) and KEY not in repr(info.value)
    with pytest.raises(ValueError, match="name of an environment variable") as info:
        OpenAIChatBackend("http://127.0.0.1:9/v1", api_key_env=KEY)  # the key where its variable's name goes
    assert KEY not in str(info.value)
    with pytest.raises(ValueError, match="MY_LLM_KEY is not set"):
        OpenAIChatBackend("http://127.0.0.1:9/v1", api_key_env="MY_LLM_KEY")
    for token in ("hf_AbCdEfGhIjKlMnOpQrStUvWx", "gsk_a1b2c3d4e5f6g7h8i9j0k1l2", "ghp_0123456789abcdefABCDEF"):
        monkeypatch.delenv(token, raising=False)
        with pytest.raises(ValueError, match="looks like a key itself") as info:  # a token where the name goes
            OpenAIChatBackend("http://127.0.0.1:9/v1", api_key_env=token)
        assert token not in str(info.value)
    for name in ("MY_SERVICE_API_KEY_2024", "ASIA_PACIFIC_API_KEY", "azure_openai_key_2024_prod", "hf_token_for_org"):
        monkeypatch.delenv(name, raising=False)
        with pytest.raises(ValueError, match=f"{name} is not set"):  # ordinary names are shown
            OpenAIChatBackend("http://127.0.0.1:9/v1", api_key_env=name)
    with pytest.raises(FileNotFoundError, match="api_key_file"):
        OpenAIChatBackend("http://127.0.0.1:9/v1", api_key_file=str(tmp_path / "missing"))


@pytest.mark.parametrize("route", ["env", "file"])
def test_key_from_env_or_file_is_sent_and_never_stored(server, route, monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text(KEY + "\n")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cache = tmp_path / "cache"
    kwargs = {"cache_dir": str(cache), "show_progress": False, "max_retries": 0}
    if route == "env":
        monkeypatch.setenv("KGL_TEST_KEY", KEY)
        backend = OpenAIChatBackend(server.url, api_key_env="KGL_TEST_KEY", **kwargs)
    else:
        backend = OpenAIChatBackend(server.url, api_key_file=str(secret / "key"), **kwargs)
    assert backend.generate(HELLO, max_new_tokens=2)[0].text == "hello"  # the server checked the key
    texts = [repr(backend), str(backend), backend.cache_key, str(vars(backend)), caplog.text]
    _assert_no_key_under(cache, *texts)
    # without the key the server refuses, and the error does not show the header
    monkeypatch.delenv("KGL_TEST_KEY", raising=False)
    with pytest.raises(LLMHTTPError, match="HTTP 401"):
        OpenAIChatBackend(server.url, model="echo", show_progress=False).generate(HELLO)


def _config(tmp_path: Path, server: ChatCompletionServer, **reasoner_args: object) -> str:
    cfg = {
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "enable_progress_bar": False,
            "default_root_dir": str(tmp_path / "logs"),
        },
        "data": {"class_path": f"{__name__}.Questions"},
        "model": {
            "class_path": f"{__name__}.ReasonerProbe",
            "init_args": {
                "reasoner": {
                    "class_path": "kglightning.llm.OpenAIChatBackend",
                    "init_args": {
                        "base_url": server.url,
                        "cache_dir": str(tmp_path / "llm_cache"),
                        "show_progress": False,
                        "max_retries": 0,
                        **reasoner_args,
                    },
                }
            },
        },
    }
    path = tmp_path / "config.in.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_cli_run_print_config_and_errors_never_show_the_key(server, monkeypatch, tmp_path, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)  # anything written to a relative path lands in the scanned folder too
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    config = _config(run, server)

    # a full predict run (the server accepts only requests that carry the key): config.yaml, cache, predictions
    main(["predict", "--config", config])
    assert server.completed_count == 2
    assert (run / "logs" / "config.yaml").exists() and (run / "llm_cache" / "responses.jsonl").exists()
    saved = yaml.safe_load((run / "logs" / "config.yaml").read_text())
    reasoner = saved["model"]["init_args"]["reasoner"]["init_args"]
    assert reasoner["api_key_env"] == "OPENAI_API_KEY" and reasoner.get("api_key") is None

    # --print_config
    with pytest.raises(SystemExit) as exc:
        main(["predict", "--config", config, "--print_config"])
    assert exc.value.code in (0, None)
    printed = capfd.readouterr()
    assert "api_key_env: OPENAI_API_KEY" in printed.out

    # an instantiation error, with the key in the environment: what Python prints is the chained traceback
    with pytest.raises((SystemExit, ValueError)) as exc:
        main(["predict", "--config", config, "--model.init_args.reasoner.init_args.max_concurrency", "0"])
    failed = capfd.readouterr()
    trace = "".join(traceback.format_exception(exc.value))
    assert "max_concurrency" in trace + failed.out + failed.err
    _assert_no_key_under(tmp_path, printed.out, printed.err, failed.out, failed.err, trace, caplog.text)


@pytest.mark.parametrize("where", ["command_line", "config_file"])
def test_cli_refuses_a_key_given_as_a_value_without_echo(server, where, monkeypatch, tmp_path, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if where == "command_line":
        args = ["--config", _config(run, server), "--model.init_args.reasoner.init_args.api_key", KEY]
    else:
        args = ["--config", _config(run, server, api_key=KEY)]
    monkeypatch.setattr(sys, "argv", ["kglightning", "seeds", *args])  # as when a subcommand passes args itself
    with pytest.raises((SystemExit, ValueError)) as exc, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["predict", *args])
    assert not [w for w in caught if KEY in str(w.message)]  # LightningCLI's warning would print every argument
    refused = capfd.readouterr()
    trace = "".join(traceback.format_exception(exc.value))
    message = refused.out + refused.err + trace
    assert "api_key_file" in message and "OPENAI_API_KEY" in message  # says how to pass the key instead
    assert server.request_count == 0 and not (run / "logs" / "config.yaml").exists()
    with pytest.raises(SystemExit):
        main(["predict", *args, "--print_config"])
    printed = capfd.readouterr()
    # the input config of the "config_file" case holds the key by the user's own doing: scan everything else
    (run / "config.in.yaml").unlink()
    _assert_no_key_under(tmp_path, refused.out, refused.err, trace, printed.out, printed.err, caplog.text)
