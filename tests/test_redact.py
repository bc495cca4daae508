"""The one rule for secrets (scalerun.redact), and the reports that apply it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerun.redact import (
    MASK,
    is_secret_name,
    redact_data,
    redact_mapping,
    redact_quoted,
    redact_text,
    redact_word,
    redact_words,
    secret_values,
)

NAMES = [
    # name, secret?
    ("HF_TOKEN", True),
    ("GITHUB_TOKEN", True),
    ("WANDB_API_KEY", True),
    ("AWS_SECRET_ACCESS_KEY", True),
    ("AWS_SESSION_TOKEN", True),
    ("MLFLOW_TRACKING_PASSWORD", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True),
    ("NGROK_AUTHTOKEN", True),  # the word closes a compound part
    ("OPENAI_APIKEY", True),
    ("api_keys", True),  # case-insensitive, plural
    ("--hf-token", True),  # option names split at '-'
    ("apiKey", True),
    ("SECRET", True),
    ("NCCL_IB_PKEY", True),  # a known, harmless false positive: shown as ***
    ("KEYBOARD", False),  # the word must close its part
    ("TOKENIZERS_PARALLELISM", False),  # scalerun sets this one itself
    ("PASSWORDLESS_SSH", False),
    ("DB_PASS", True),  # issue 34: written in clear by jobscript --env
    ("MYSQL_PASSWD", True),
    ("GPG_PASSPHRASE", True),
    ("BYPASS_CACHE", True),  # a harmless false positive of PASS: shown as ***
    ("KEYTAB_DIR", False),
    ("NCCL_SOCKET_IFNAME", False),
    ("PWD", False),
    ("MASTER_ADDR", False),
    ("", False),
]


@pytest.mark.parametrize(("name", "secret"), NAMES)
def test_which_names_are_secret(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


ENV = {"HF_TOKEN": "hf_abcdefgh123", "WANDB_API_KEY": "k", "HOME": "/home/a", "TOKENIZERS_PARALLELISM": "false"}


def test_mapping_masks_secret_names_only() -> None:
    assert redact_mapping(ENV) == {"HF_TOKEN": MASK, "WANDB_API_KEY": MASK, "HOME": "/home/a",
                                   "TOKENIZERS_PARALLELISM": "false"}


def test_free_text_search_skips_values_too_short_to_find() -> None:
    assert secret_values(ENV) == ("hf_abcdefgh123",)


TEXTS = [
    # text, shown
    ("python train.py --token hf_abcdefgh123", f"python train.py --token {MASK}"),
    ("url=https://u:hf_abcdefgh123@host/x", f"url=https://u:{MASK}@host/x"),
    ("export HF_TOKEN=other-value # set", f"export HF_TOKEN={MASK} # set"),
    ("HF_TOKEN='a b c' python x", f"HF_TOKEN={MASK} python x"),
    ('--api-key="q \\" r" next', f"--api-key={MASK} next"),
    ("KEYBOARD=us NCCL_DEBUG=INFO", "KEYBOARD=us NCCL_DEBUG=INFO"),
]


@pytest.mark.parametrize(("text", "shown"), TEXTS)
def test_free_text(text: str, shown: str) -> None:
    assert redact_text(text, secret_values(ENV)) == shown


WORDS = [
    # command line, shown
    (["launch", "--env", "HF_TOKEN=abc", "--env", "X=1"], ["launch", "--env", f"HF_TOKEN={MASK}", "--env", "X=1"]),
    (["train.py", "--api-key", "abc", "--lr", "1"], ["train.py", "--api-key", MASK, "--lr", "1"]),
    (["train.py", "--hf-token=abc"], ["train.py", f"--hf-token={MASK}"]),
    (["train.py", "--api-key", "--verbose"], ["train.py", "--api-key", "--verbose"]),
    (["x", "hf_abcdefgh123"], ["x", MASK]),
]


@pytest.mark.parametrize(("words", "shown"), WORDS)
def test_command_lines(words: list[str], shown: list[str]) -> None:
    assert redact_words(words, secret_values(ENV)) == shown


def test_single_words_and_messages() -> None:
    assert redact_word("A_PASSWORD=x=y") == f"A_PASSWORD={MASK}"
    assert redact_word("PATH=/bin") == "PATH=/bin"
    assert redact_quoted("already set by you (scalerun would use 'abc': site)") == (
        f"already set by you (scalerun would use '{MASK}': site)")


def test_run_records_keep_numbers_and_mask_words() -> None:
    record = {"command": ["scalerun", "launch", "--env", "HF_TOKEN=abc", "t.py"], "nnodes": 2,
              "script_args": ["--token", "hf_abcdefgh123"], "DB_PASSWORD": "x", "start": 1.5}
    assert redact_data(record, secret_values(ENV)) == {
        "command": ["scalerun", "launch", "--env", f"HF_TOKEN={MASK}", "t.py"], "nnodes": 2,
        "script_args": ["--token", MASK], "DB_PASSWORD": MASK, "start": 1.5}


def test_reports_mask_the_kept_command_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run.json written before masking existed, and a study's script arguments."""
    from scalerun.report.load import read_run_info
    from scalerun.scaling.report import shown_args

    monkeypatch.setenv("WANDB_API_KEY", "wandb-0123456789")
    old = tmp_path / "run.json"
    old.write_text(json.dumps({"command": ["scalerun", "launch", "t.py", "--key", "wandb-0123456789"],
                               "nnodes": 1}))
    info, problems = read_run_info(old)
    assert problems == [] and info == {"command": ["scalerun", "launch", "t.py", "--key", MASK], "nnodes": 1}
    assert shown_args(("--hf-token", "abc", "--lr", "0.1")) == ["--hf-token", MASK, "--lr", "0.1"]


def test_exec_notes_mask_a_users_secret_value(tmp_path: Path) -> None:
    """``scalerun exec`` keeps a user's differing value and says so; a token in it is masked
    in that note and in the verbose line (the command still gets the real value)."""
    import os
    import subprocess
    import sys

    secret = "hf_tok3n-abcdefgh"
    env = {**os.environ, "HF_TOKEN": secret, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": f"host-{secret}", "MASTER_PORT": "29500", "SCALERUN_BIND": "0"}
    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "scalerun", "exec", "-v", "--env",
                           "MASTER_ADDR=127.0.0.1", "--", sys.executable, "-c",
                           "import os; print(os.environ['MASTER_ADDR'])"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"host-{secret}"  # the user's value wins, unchanged
    assert "kept MASTER_ADDR=" in done.stderr and MASK in done.stderr
    assert secret not in done.stderr


def test_a_studys_launch_log_masks_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from scalerun.scaling.study import run_logged

    monkeypatch.setenv("WANDB_API_KEY", "wandb-0123456789")
    log = tmp_path / "launch.log"
    outcome = run_logged([sys.executable, "-c", "pass", "--key", "wandb-0123456789"], log)
    assert outcome.exit_code == 0
    assert "wandb-0123456789" not in log.read_text() and MASK in log.read_text()
