"""Tools, for the offline rules model (:mod:`memory.rules`): the names and kinds of
tools (editor, phone, computer, OS, browser, ...), and the phrase families of using one and of
switching ("I switched from Vim to Neovim", 我把编辑器换成了VS Code) -> ``tool:<kind>``."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.rule_words import CHANGE, CJK, END, OWN, PRONOUN, Rule, clean, trim

# --- names and kinds ---------------------------------------------------------------------
# kind -> names; the first spelling of an entry is how a memory writes it, "!" marks a name
# that is also a common word (matched only as written, capitalised)
_TOOLS: dict[str, tuple[str, ...]] = {
    "editor": ("Vim", "Neovim|nvim", "Emacs", "Spacemacs", "Doom Emacs", "VS Code|vscode|"
               "visual studio code", "Sublime Text|sublime", "!Atom", "IntelliJ IDEA|intellij",
               "PyCharm", "WebStorm", "GoLand", "CLion", "!Rider", "Xcode", "Android Studio",
               "Eclipse", "NetBeans", "!Nano", "Notepad++", "!Zed", "!Cursor", "!Helix",
               "Gedit", "TextMate", "BBEdit", "Visual Studio", "!Fleet", "Kakoune", "RStudio",
               "JupyterLab", "Vi"),
    "phone": ("iPhone", "Android", "Pixel|Google Pixel", "Galaxy|Samsung Galaxy", "OnePlus",
              "Xiaomi|小米", "Huawei|华为", "Fairphone", "BlackBerry", "Motorola", "Nokia",
              "苹果手机", "安卓", "鸿蒙|HarmonyOS", "荣耀", "OPPO", "vivo", "Huawei Mate", "!Mate",
              "Redmi|红米", "Xperia|Sony Xperia", "Nothing Phone"),
    "computer": ("MacBook|macbook air|macbook pro", "ThinkPad", "Chromebook", "!Surface",
                 "iMac", "Mac Mini", "Dell XPS|xps", "!Framework laptop", "!Mac"),
    "os": ("Linux", "Ubuntu", "Debian", "Fedora", "!Arch|Arch Linux", "Windows", "macOS|os x",
           "Linux Mint", "Manjaro", "NixOS", "FreeBSD", "Pop!_OS|pop os"),
    "browser": ("Chrome|google chrome", "Firefox", "Safari", "!Edge|microsoft edge", "!Brave",
                "!Opera", "Vivaldi", "!Arc", "Chromium", "Tor Browser"),
    "language": ("Python", "Java", "JavaScript", "TypeScript", "!Go|golang", "!Rust", "C++",
                 "C#", "Kotlin", "!Swift", "!Ruby", "PHP", "Scala", "Haskell", "Elixir",
                 "Clojure", "Julia", "Perl", "Lua", "Dart", "!Zig", "OCaml", "F#", "Erlang"),
    "shell": ("zsh", "bash", "!fish", "PowerShell", "Nushell"),
    "terminal": ("iTerm2|iterm", "Alacritty", "!Kitty", "WezTerm", "!Warp", "Ghostty"),
    "notes": ("Notion", "Obsidian", "Evernote", "OneNote", "Logseq", "Roam Research|roam",
              "!Bear", "Apple Notes", "Joplin", "印象笔记", "有道云笔记", "语雀", "飞书文档"),
    "email": ("Gmail", "Outlook", "Proton Mail|protonmail", "Thunderbird", "Fastmail",
              "QQ邮箱", "163邮箱"),
    "music": ("Spotify", "Apple Music", "Tidal", "Deezer", "YouTube Music", "网易云音乐|网易云",
              "QQ音乐", "酷狗"),
    "password": ("1Password", "Bitwarden", "LastPass", "KeePass|keepassxc", "Dashlane"),
    "tasks": ("Todoist", "TickTick|滴答清单", "Things 3", "Microsoft To Do", "OmniFocus"),
    "chat": ("Slack", "Microsoft Teams", "Discord", "Telegram", "WhatsApp", "WeChat|微信",
             "钉钉|DingTalk", "飞书|Lark", "企业微信"),
    "search": ("Google", "Bing", "DuckDuckGo", "Kagi", "Baidu|百度"),
}
# several at once are common: a plain "I use ..." gives them no slot, only a switch does
SHARED_KINDS = frozenset({"language", "chat", "search"})

_KIND_NOUNS = {
    "editor": "text editor|code editor|editor|ide|编辑器|IDE",
    "phone": "smartphone|mobile phone|cell phone|phone|mobile|手机",
    "computer": "laptop|computer|notebook|desktop|work machine|电脑|笔记本电脑|笔记本",
    "os": "operating system|os|distro|操作系统|系统",
    "browser": "web browser|browser|浏览器",
    "language": "programming language|main language|language|编程语言|开发语言",
    "shell": "shell",
    "terminal": "terminal emulator|terminal|终端",
    "notes": "note-taking app|notes app|note app|笔记软件|笔记应用|笔记工具",
    "email": "email client|mail client|email provider|email|邮箱",
    "music": "music app|music service|music streaming service|音乐软件|听歌软件",
    "password": "password manager|密码管理器",
    "tasks": "to-do app|todo app|task manager|待办软件|待办工具",
    "search": "search engine|搜索引擎",
}
KIND_EN = "|".join(sorted((n for v in _KIND_NOUNS.values() for n in v.split("|")
                           if n.isascii()), key=len, reverse=True))
KIND_ZH = "|".join(sorted((n for v in _KIND_NOUNS.values() for n in v.split("|")
                           if not n.isascii()), key=len, reverse=True))
_KIND_OF_NOUN = {n.lower(): k for k, v in _KIND_NOUNS.items() for n in v.split("|")}


def _tool_table() -> list[tuple[re.Pattern[str], str, str]]:
    rows = []
    for kind, names in _TOOLS.items():
        for entry in names:
            strict = entry.startswith("!")
            spellings = entry.lstrip("!").split("|")
            shown = next((s for s in spellings if s.isascii()), spellings[0])
            for spelling in spellings:
                body = re.escape(spelling).replace(r"\ ", r"[ -]?")
                if spelling.isascii():
                    row = re.compile(rf"(?:{body})(?![A-Za-z0-9_+#])", 0 if strict else re.I)
                    rows.append((row, shown, kind))
                else:  # a Chinese name is written as the user wrote it
                    rows.append((re.compile(body), spelling, kind))
    return sorted(rows, key=lambda r: -len(r[0].pattern))


_TOOL_ROWS = _tool_table()
_LEAD_WORDS = re.compile(r"^(?:(?:an?|the|my|our|using|to|with|new|brand new|old|current|"
                         r"trusty)\s+|的是|的|一个|一台|一部|一款|新的|了|个|台|部|款|新)+", re.I)
# a model after a name: "iPhone 15 Pro", "Pixel 8", "MacBook Air", "Galaxy S24"
_MODEL = re.compile(r"(?:[ -](?:\d[\w.+-]*|[A-Z][A-Za-z]?\d[\w.+-]*|Pro|Max|Air|Mini|Plus|Ultra|"
                    r"Lite|SE|Carbon|Fold|Flip))+")
_ASCII = r"[A-Za-z0-9_+#.-]"
_PRODUCT = re.compile(rf"(?:[A-Z]{_ASCII}*|[a-z]+[A-Z]{_ASCII}*|\d{_ASCII}*[A-Za-z]{_ASCII}*)"
                      rf"(?: (?:[A-Z]{_ASCII}*|\d{_ASCII}*))?")
_NOT_PRODUCT = re.compile(
    r"(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)days?|January|February|March|April|May|June|July|"
    r"August|September|October|November|December|I|I'm|I've|English|Spanish|French|German|"
    r"Italian|Portuguese|Dutch|Chinese|Mandarin|Japanese|Korean|Russian|Arabic|Hindi|The|A|An|"
    r"It|This|That|We|My|Our", re.I)


def tool(raw: str, *, product_ok: bool = False) -> tuple[str, str | None] | None:
    """The tool a phrase starts with, as (name, kind): a known name (with its model, if
    any), else with ``product_ok`` a product-like capitalised name of unknown kind."""
    text = _LEAD_WORDS.sub("", raw.strip())
    for pattern, name, kind in _TOOL_ROWS:
        if m := pattern.match(text):
            model = _MODEL.match(text, m.end()) if kind in ("phone", "computer") else None
            said = text[: m.end()] if kind in ("phone", "computer") else name
            return (said + (model.group(0) if model else "")).strip().rstrip(".-"), kind
    if product_ok and (m := _PRODUCT.match(text)) and not _NOT_PRODUCT.fullmatch(
            m.group(0).split(" ")[0]):
        return m.group(0), None
    return None


def kind_of_noun(noun: str | None) -> str | None:
    return None if noun is None else _KIND_OF_NOUN.get(noun.lower())


def kind_of_name(name: str) -> str | None:
    found = tool(name)
    return found[1] if found else None



# --- the phrase families ----------------------------------------------------------------
def _uses(m: re.Match[str], name: str, kind: str | None, *, switch: bool = False,
          replaces: str | None = None, zh: bool = False) -> Candidate:
    """A tool: its kind is its slot when one of that kind replaces another (a switch, or
    any use of a kind people have one of at a time)."""
    slot = None
    if kind and (switch or kind not in SHARED_KINDS or CHANGE.search(m.string)):
        slot = f"tool:{kind}"
    return Candidate(f"使用{name}" if zh else f"Uses {name}", importance=5, slot=slot,
                     replaces=replaces)


def _switched(m: re.Match[str]) -> Candidate | None:
    verb = m.group("verb").lower()
    zh = CJK.search(verb) is not None
    strong = verb.startswith(("switch", "migrat", "convert", "made the switch", "改用", "转用",
                              "换用"))
    new = tool(m.group("new"), product_ok=strong or (zh and m.group("new")[:1].isascii()))
    said_old = m.groupdict().get("old")
    old = tool(said_old, product_ok=True) if said_old else None
    kind = kind_of_noun(m.groupdict().get("kind")) or kind_of_noun(said_old and
                                                                   clean(said_old))
    kind = kind or (new and new[1]) or (old and old[1])
    if new is None or (kind is None and not strong and old is None):
        return None
    replaces = old[0] if old else None
    return _uses(m, new[0], kind, switch=True, replaces=replaces, zh=zh)


def _replaced(m: re.Match[str]) -> Candidate | None:
    new = tool(m.group("new"), product_ok=True)
    old = tool(m.group("old"), product_ok=True)
    kind = kind_of_noun(m.group("kind")) or (new and new[1]) or (old and old[1])
    if new is None or old is None or kind is None:
        return None
    return _uses(m, new[0], kind, switch=True, replaces=old[0])


def _use(m: re.Match[str]) -> Candidate | None:
    found = tool(m.group("what"))
    if found:
        return _uses(m, found[0], found[1])
    what = trim(m.group("what"))
    if not what or PRONOUN.match(what):
        return None
    return Candidate(f"Uses {what}", importance=5)


def _use_zh(m: re.Match[str]) -> Candidate | None:
    found = tool(m.group("new"), product_ok=m.group("new").strip()[:1].isascii())
    return _uses(m, found[0], found[1], zh=True) if found else None


def _my_tool(m: re.Match[str]) -> Candidate | None:
    found = tool(m.group("new"), product_ok=True)
    kind = kind_of_noun(m.group("kind"))
    return _uses(m, found[0], kind, switch=True) if found and kind else None


def _on_tool(m: re.Match[str]) -> Candidate | None:
    found = tool(m.group("new"))
    if not found or found[1] is None or found[1] in SHARED_KINDS or \
            not CHANGE.search(m.string):
        return None
    return _uses(m, found[0], found[1], switch=True)


def _code_in(m: re.Match[str]) -> Candidate | None:
    """"I code in Rust", "I run Ubuntu": a language, or an OS one runs."""
    found = tool(m.group("what"))
    runs = m.group("verb").lower().startswith("run")
    if found is None or found[1] != ("os" if runs else "language"):
        return None
    return _uses(m, found[0], found[1])


# what is got with a phone or a computer is not one ("a new iPhone case", 小米的股票)
_NOT_DEVICE = re.compile(r"\s*(?:case|cover|charger|cable|screen|protector|bag|sleeve|stand|dock|"
                         r"keyboard|mouse|battery|adapter|holder|strap|skin|mount|sticker|box|"
                         r"bill|contract|plan|sim|number|stock|shares)\b|"
                         r"\s*(?!手机|电脑|笔记本|平板)[^\x00-\x7f了啦呀啊吧，,。.!！]",
                         re.I)


def _device(m: re.Match[str]) -> Candidate | None:
    """"I got a new MacBook", 入手了MacBook Pro: a phone or a computer replaces the one
    before."""
    found = tool(m.group("new"))
    if found is None or found[1] not in ("phone", "computer"):
        return None
    said = _LEAD_WORDS.sub("", m.group("new").strip())
    if said.startswith(found[0]) and _NOT_DEVICE.match(said, len(found[0])):
        return None
    return _uses(m, found[0], found[1], switch=True, zh=CJK.search(m.group(0)) is not None)


def _daily_driver(m: re.Match[str]) -> Candidate | None:
    """"VS Code with the Vim extension is my daily driver now": a known tool only."""
    found = tool(m.group("new"))
    return _uses(m, found[0], found[1], switch=True) if found else None


def _used_to_use(m: re.Match[str]) -> Candidate | None:
    new = tool(m.group("new"), product_ok=True)
    old = tool(m.group("old"), product_ok=True)
    kind = (new and new[1]) or (old and old[1])
    if new is None or (kind is None and old is None):
        return None
    return _uses(m, new[0], kind, switch=True, replaces=old[0] if old else None)


_KIND = rf"(?P<kind>(?i:{KIND_EN}))"
TOOLS = [
    Rule(re.compile(r"\b(?i:used to use) (?P<old>[^,;]{1,60}?),? (?:(?i:but|and) )?"
                    r"(?:(?i:now|these "
                    r"days|nowadays),? )?(?:(?i:i|we)(?:'m|'ve| am| have)? )?(?:(?i:use|using|on|"
                    r"switched to|moved to|moved over to)) (?P<new>[^,;.]{1,60})"), _used_to_use),
    Rule(re.compile(r"\b(?P<verb>(?i:switched|moved|migrated|changed|converted|transitioned|went|"
                    r"jumped|upgraded|downgraded|made the (?:switch|jump|move)))(?: (?i:over|"
                    r"back|across|all|ship|entirely|completely|fully))*(?: (?i:my|our) " + _KIND
                    + r")?(?: (?i:from) (?:(?i:using) )?(?P<old>[^,;]{1,60}?))? "
                    r"(?i:to|over to|for) "
                    r"(?:(?i:using) )?(?P<new>[^,;]{1,60})"), _switched),
    Rule(re.compile(r"\b(?i:replaced|swapped(?: out)?|traded(?: in)?|ditched|dropped|gave up|"
                    r"abandoned|dumped|retired|uninstalled|got rid of)(?: (?i:my|our) " + _KIND
                    + r")? (?P<old>[^,;]{1,60}?) (?i:for|with|in favou?r of) (?P<new>[^,;]{1,60})"),
         _replaced),
    Rule(re.compile(r"\b(?:(?i:started|began) )?(?i:use|using)\s+(?P<what>[\w +#'-]{1,60}?)" + END),
         _use),
    Rule(re.compile(r"\b(?P<verb>(?i:code|coding|program|programming|develop|write code|"
                    r"writing code|run|running)) (?:(?i:in|on) )?(?P<what>[\w +#'-]{1,60}?)" + END),
         _code_in),
    Rule(re.compile(r"\b(?i:my|our) (?:(?i:new|current|main|primary|default|daily|go-to|"
                    r"everyday|work|personal) )*" + _KIND + r"(?: (?i:of choice|these days|"
                    r"nowadays|now))? (?i:is|'s) "
                    r"(?:(?i:now|currently) )?(?P<new>[^,;]{1,60})"), _my_tool, OWN),
    Rule(re.compile(r"(?:'m|\b(?i:am)) (?:(?i:now) )?(?i:on) (?P<new>[^,;]{1,60})"), _on_tool),
    Rule(re.compile(r"(?:'m|\b(?i:am)) (?:(?i:now|officially|fully|a happy) )*(?:(?i:a|an) )?"
                    r"(?P<new>[\w+#. -]{1,30}?) (?i:user|convert|person)\b"),
         lambda m: _uses(m, found[0], found[1]) if (found := tool(m.group("new"))) else None),
    Rule(re.compile(r"(?:^|[,;:]\s*|\b(?:and|but|so|now) )(?P<new>[A-Z][\w+#.-]*(?: [A-Z0-9]"
                    r"[\w+#.-]*)?) (?i:is|'s) (?:(?i:now) )?(?i:my|our) (?:(?i:new|main|default|"
                    r"primary|go-to|daily) )*" + _KIND + r"\b"), _my_tool, OWN),
    Rule(re.compile(r"\b(?i:have|got|bought|'ve got|have got|picked up)(?: (?i:myself))? "
                    r"(?:(?i:a|an|the) )?(?:(?i:new|brand new|shiny new) )?(?P<new>[^,;]{1,60})"),
         _device),
    # "I got a new phone, a Pixel 9", "I bought a new laptop: a ThinkPad X1"
    Rule(re.compile(r"\b(?i:have|got|bought|'ve got|have got|picked up|treated myself to)"
                    r"(?: (?i:myself))? (?i:a|an) (?:(?i:new|brand new|shiny new) )?" + _KIND
                    + r"(?:,|:| -| –| —)? (?:(?i:a|an|the) )?(?P<new>[^,;.!?]{1,60})"), _my_tool),
    Rule(re.compile(r"(?:^|[,;:]\s*|\b(?:and|but|so|now) )(?P<new>[A-Z][\w+#.-]*(?: [A-Z0-9]"
                    r"[\w+#.-]*)*)(?: [^,;.!?]{1,40}?)? (?i:is|'s) (?:(?i:now) )?(?i:my) "
                    r"(?:(?i:new) )?(?i:daily driver)\b"), _daily_driver, OWN),
    # 入手了MacBook Pro, 新买了一台ThinkPad
    Rule(re.compile(r"(?:入手|新买|买|购入|剁手|拿下)了(?:一?(?:个|台|部|款))?(?:新的?)?"
                    r"(?P<new>[^，,；;。！!？?]{1,40})"), _device),
    Rule(re.compile(r"(?:(?P<from>从|把)(?P<old>[^，,；;。从把]{1,20}?))?(?:(?P<kind>" + KIND_ZH
                    + r")(?:也|都)?)?(?P<verb>改用|换成|换用|转用|改成|换到|切换到|切换成|切到|"
                    r"转到|迁移到|换了|转投|改为|换为)了?(?P<new>[^，,；;。！!？?]{1,60})"),
         _switched),
    Rule(re.compile(r"(?:写代码|编程|开发|办公|记笔记|做笔记|上网|听歌|聊天|工作|平时)?(?:都|也|主要)?"
                    r"(?:在)?(?:用|使用)(?P<new>[^，,；;。！!？?]{1,60})"), _use_zh),
]
