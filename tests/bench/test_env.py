"""Which code a benchmark ran: the working tree's hash, found again as a commit here."""

from __future__ import annotations

import subprocess

import pytest

from mstar.bench.env import commit_of_tree, working_tree_hash
from mstar.bench.report import code_label


def git(repo, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / ".gitignore").write_text("results/\n")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_copy_of_a_commits_files_hashes_to_its_tree_whatever_its_index_says(repo):
    (repo / "results").mkdir()
    (repo / "results" / "run.json").write_text("{}")  # ignored: not part of the code
    git(repo, "rm", "-q", "--cached", "a.py")  # a stale index (a copied tree's metadata)
    tree = working_tree_hash(str(repo))
    assert tree == git(repo, "rev-parse", "HEAD^{tree}")
    assert commit_of_tree(tree, str(repo)) == git(repo, "rev-parse", "--short=7", "HEAD")[:7]
    assert "a.py" not in git(repo, "diff", "--cached", "--name-only", "--diff-filter=A")  # index untouched


def test_edited_files_hash_to_a_tree_no_commit_has(repo):
    (repo / "a.py").write_text("x = 2\n")
    tree = working_tree_hash(str(repo))
    assert tree is not None and tree != git(repo, "rev-parse", "HEAD^{tree}")
    assert commit_of_tree(tree, str(repo)) is None
    git(repo, "commit", "-q", "-am", "second")
    assert commit_of_tree(tree, str(repo)) == git(repo, "rev-parse", "--short=7", "HEAD")[:7]


def test_code_label_prefers_the_commit_with_the_runs_files(monkeypatch):
    monkeypatch.setattr("mstar.bench.env.commit_of_tree", lambda tree, directory=None: "5808c2d")
    assert code_label({"commit": "1e794b2-dirty", "tree": "abc"}) == "commit 5808c2d (its files)"
    monkeypatch.setattr("mstar.bench.env.commit_of_tree", lambda tree, directory=None: None)
    label = code_label({"commit": "1e794b2-dirty", "tree": "0123456789abcdef"})
    assert label == "commit 1e794b2-dirty, tree 0123456789ab (no commit here has those files)"
    assert code_label({"commit": "abc1234"}) == "commit abc1234"  # results from before trees


def test_outside_a_repository_there_is_no_tree(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    assert working_tree_hash(str(tmp_path)) is None
