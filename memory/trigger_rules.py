"""Text rules of the trigger policy (SPEC §3): explicit instructions and trivial turns.

Pure functions over a message's text. An *explicit* instruction ("remember this", "from now
on always ...", "记住", "以后都") triggers extraction at once. A *trivial* turn is a pure
acknowledgement or greeting ("ok", "thanks", "继续", "你好"); a job whose user messages are
all trivial is resolved without an LLM call. Answers such as "yes" / "no" are *not* trivial:
after a question they carry a fact.
"""

from __future__ import annotations

import re
import unicodedata

_EXPLICIT_EN = re.compile(
    r"\b(remember (this|that|it|my|i\b)|please remember|remember:|don'?t forget|do not forget|"
    r"keep in mind|from now on|going forward,? (always|never|please)|make a note|note (this|that) "
    r"down|for future reference|always remember|never forget)",
    re.IGNORECASE,
)
_EXPLICIT_ZH = re.compile(
    r"(记住|记下|记一下|别忘了|不要忘记|以后都|以后请|以后一律|从现在开始|今后都)"
)

# Latin acknowledgement / greeting words; a message made only of these is trivial.
_TRIVIAL_WORDS = frozenset(
    """ok okay okey k kk alright allright fine cool great nice good perfect awesome thanks
    thank you thx ty tysm cheers much so very lot a continue go on proceed next more sure
    gotcha got it understood noted hi hello hey hiya morning evening bye goodbye cya see
    later lol haha hmm uh um ah oh wow np welcome""".split()
)
# CJK acknowledgement / greeting phrases, matched by segmentation (no spaces in Chinese).
_TRIVIAL_CJK = frozenset(
    """好的 好 好吧 好哒 嗯 嗯嗯 哦 噢 啊 呀 明白了 明白 懂了 知道了 了解 收到 继续 接着
    接着说 请继续 你好 您好 早上好 晚上好 谢谢 谢谢你 谢谢您 多谢 感谢 再见 拜拜 行 可以
    没问题 哈哈 哈 了 的 啦 呢 吧""".split()
)
_MAX_TRIVIAL_CHARS = 40


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    kept = [
        ch if not unicodedata.category(ch).startswith(("P", "S", "C")) else " "
        for ch in text
    ]
    return " ".join("".join(kept).split())


def is_explicit(text: str) -> bool:
    """True if the text asks to remember something now."""
    return bool(_EXPLICIT_EN.search(text) or _EXPLICIT_ZH.search(text))


def _segments_cjk(token: str) -> bool:
    """Can ``token`` be split entirely into trivial CJK phrases?"""
    ok = [True] + [False] * len(token)
    for end in range(1, len(token) + 1):
        ok[end] = any(ok[start] and token[start:end] in _TRIVIAL_CJK for start in range(end))
    return ok[-1]


def is_trivial(text: str) -> bool:
    """True for a pure acknowledgement or greeting, which never costs an LLM call on its own."""
    norm = _normalise(text)
    if not norm:
        return True  # punctuation or emoji only
    if len(norm) > _MAX_TRIVIAL_CHARS or is_explicit(text):
        return False
    for token in norm.split():
        if token.isascii():
            if token not in _TRIVIAL_WORDS:
                return False
        elif not _segments_cjk(token):
            return False
    return True
