"""Explicit-instruction and trivial-turn rules (EN and ZH)."""

from __future__ import annotations

import pytest

from memstream.memory.trigger_rules import is_explicit, is_trivial

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text", [
    "ok", "OK!", "okay thanks", "Thanks a lot!", "thank you", "continue", "go on", "hi",
    "Hello :)", "好的", "明白了", "继续", "你好", "好的，谢谢！", "嗯嗯", "👍", "...",
])
def test_trivial(text):
    assert is_trivial(text)


@pytest.mark.parametrize("text", [
    "no", "yes", "I have 3 kids", "ok, I moved to Paris", "thanks, my budget is 50k",
    "我住在上海", "好的，我不再吃肉了", "remember this", "ok remember that I'm vegan",
    "continue with the equity fund analysis please",
])
def test_not_trivial(text):
    assert not is_trivial(text)


@pytest.mark.parametrize("text", [
    "Remember this: I'm allergic to nuts", "please remember my son's name is Leo",
    "From now on, always reply in French", "Don't forget I'm vegan",
    "记住，我对青霉素过敏", "以后都用简体中文回答", "从现在开始叫我老王",
])
def test_explicit(text):
    assert is_explicit(text)


@pytest.mark.parametrize("text", [
    "I remembered my keys", "Do you remember the movie?", "now, what about Paris?",
    "我记不清了", "以后再说吧", "你还记得吗？", "Do you remember me?",
])
def test_not_explicit(text):
    assert not is_explicit(text)
