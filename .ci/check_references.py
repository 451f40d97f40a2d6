#!/usr/bin/env python3
"""Fails when the docs or the comments cite a file or a code symbol that no longer exists.

Run by the `format` leg of quickstart.sh (`python3 .ci/check_references.py`, from any directory;
python3's standard library and git only). Prints each stale reference as FILE:LINE: what, and
exits 1 if there is any.

What is read
  * Prose: README.md, docs/*.md, bench/*.md, whole (fenced code blocks included for paths).
  * Comments of every tracked source file: C-family (.cpp .hpp .h .inl .comp .glsl .def: // and
    /* */ outside string literals) and '#'-comment files (CMake, shell, Python, YAML, .ci/*),
    excluding test data (tests/data/, tests/fuzz/corpus/).

What is checked
  1. Paths: a word that starts with one of the repository's top folders (src/ include/ shaders/
     tests/ tools/ docs/ bench/ examples/ cmake/ python/ .ci/ .github/) and is not part of a longer
     path or URL. The path ends at a character that cannot be in one of qkv's file names (so
     `tests/fuzz/corpus/<name>` checks tests/fuzz/corpus/, `src/api/dispatch.cpp:57` checks the
     file, `src/...` checks src/); trailing punctuation is dropped; `*` is a glob. It must be a
     tracked file or a folder holding one (git ls-files), so a build output never counts.
  2. Symbols, in `backticked` spans (inline code in Markdown, backticks in comments; fenced
     blocks are examples, not checked). A span is a symbol only if, once argument lists `(...)`
     and template arguments `<...>` are dropped, it is a name or a qualified name (`a::b`, `a.b`,
     `a->b`), e.g. `run_sdpa`, `plan_decode()`, `qkv::cpu::sdpa`, `last_call().device_range_check`.
     Of its parts, these must be words of the code (identifiers or string contents of the tracked
     sources with their comments removed, Markdown excluded):
       - snake_case parts (with an underscore): `kv_cache`, `choose_gemm_tiles`;
       - every part after `qkv::`;
       - a single name written as a call: `trim()`;
       - SCREAMING_CASE parts (macros, environment variables) except the names of other projects'
         (prefixes in FOREIGN_CAPS: Vulkan, C library, Mesa, the sanitizers, CMake, ...).
     Skipped as not qkv's: camelCase names (the Vulkan and GLSL APIs: `maxStorageBufferRange`,
     `subgroupShuffle`), spans that start with another library's namespace (FOREIGN_ROOTS:
     `std::`, `torch.`, `F.`, `np.`, ...), and bare file names (`x.npy`; a source file's bare name
     such as `flash_cpu.comp` must be the name of a tracked file).
  3. Anywhere in prose and comments (backticks or not): every QKV_* name (environment variables,
     macros) must be a word of the code.
  4. Where a symbol is placed in a file, "`symbol` in `path`" or "`symbol` (`path`)", its last
     part must be a word of that file's code.

A path part holding a placeholder in capitals (`bench/lavapipe-DATE.json`, `tests/cli/work/NAME`)
stands for a file not named yet: only its folder is checked.

A line holding `refcheck: ignore` is not checked (for text that cites history on purpose).
"""

import fnmatch
import os
import re
import subprocess
import sys

TOP_FOLDERS = ("src", "include", "shaders", "tests", "tools", "docs", "bench", "examples", "cmake", "python", ".ci",
               ".github")
PROSE_GLOBS = ("README.md", "docs/*.md", "bench/*.md")
C_FAMILY = (".cpp", ".hpp", ".h", ".inl", ".comp", ".glsl", ".def")
HASH_FAMILY = (".cmake", ".sh", ".py", ".yml", ".yaml", ".supp", ".in", ".txt")
SKIP_PREFIXES = ("tests/data/", "tests/fuzz/corpus/")
SOURCE_EXTENSIONS = ("cpp", "hpp", "h", "inl", "comp", "glsl", "def", "cmake", "py", "sh", "md")
FILE_EXTENSIONS = SOURCE_EXTENSIONS + ("npy", "json", "txt", "so", "dll", "exe", "tmp", "supp", "yml", "in", "log",
                                       "spv", "reg", "csv", "html", "gz", "deb", "lib", "a", "o", "toml")
FOREIGN_ROOTS = {"std", "torch", "F", "np", "numpy", "os", "sys", "math", "CLI", "nlohmann", "Catch", "json",
                 "subprocess", "pathlib", "glslang", "spv", "vk", "gl", "nn", "args", "ctest", "cmake", "apt",
                 "git", "python3", "pip"}
FOREIGN_CAPS = ("VK_", "GL_", "SPV_", "FLT_", "DBL_", "INT", "UINT", "SIZE_", "NAME_MAX", "PATH_MAX", "MAX_PATH",
                "EXIT_", "SIG", "O_", "RTLD_", "LD_", "DYLD_", "ASAN_", "UBSAN_", "LSAN_", "MESA_", "LP_", "GALLIVM_",
                "OMP_", "CMAKE_", "DEBIAN_", "XDG_", "WINE", "CUDA_", "NVIDIA_", "MKL_", "OPENBLAS_", "PYTHON",
                "CLI11_", "NDEBUG", "NOMINMAX", "WIN32", "_WIN32", "__", "GLSL_", "POSIX", "EOF", "CP_", "HOME",
                "PATH", "LC_", "ENV", "EXT_", "KHR_", "AMD_", "NV_", "INTEL_", "ARM_", "CPU_", "UTF", "TMP",
                "FE_", "ERANGE", "EINTR", "EEXIST", "ENOENT", "E2BIG", "MADV_", "MAP_", "PROT_", "SEEK_", "S_I")
IGNORE_MARK = "refcheck: ignore"

PATH_RE = re.compile(r"(?<![\w./\-~$@])((?:%s)/[\w.\-/*+]*)" % "|".join(re.escape(f) for f in TOP_FOLDERS))
SPAN_RE = re.compile(r"(`+)(.+?)\1")
NAME_RE = re.compile(r"^[A-Za-z_]\w*(?:(?:::|\.|->)[A-Za-z_]\w*)*$")
PLACEHOLDER_RE = re.compile(r"(?<![A-Za-z])[A-Z]{2,}(?![a-z])")
PLACED_RE = re.compile(r"`([^`]+)`(?: in | \()`([^`]+)`")
QKV_CAPS_RE = re.compile(r"(?<![\w$])QKV_[A-Z0-9_]*[A-Z0-9](?!\w)")
WORD_RE = re.compile(r"[A-Za-z_]\w*")


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
    return [p for p in out.decode("utf-8").split("\0") if p]


def strip_c_comments(text):
    """(code, comments): the text with comments blanked, and [(line, comment text)]."""
    code, comments = [], []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            comments.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                comments.append((line + k, part))
            line += text.count("\n", i, j)
            code.append("\n" * text.count("\n", i, j))
            i = j + 2
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                code.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            code.append(text[i:end])
            line += text.count("\n", i, end)
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            code.append(text[i:j + 1])
            i = j + 1
        else:
            if c == "\n":
                line += 1
            code.append(c)
            i += 1
    return "".join(code), comments


def strip_hash_comments(text):
    code_lines, comments = [], []
    for number, raw in enumerate(text.split("\n"), 1):
        quote, cut = None, None
        for k, c in enumerate(raw):
            if quote:
                if c == "\\":
                    continue
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or raw[k - 1] in " \t"):
                cut = k
                break
        if cut is None:
            code_lines.append(raw)
        else:
            code_lines.append(raw[:cut])
            comments.append((number, raw[cut + 1:]))
    return "\n".join(code_lines), comments


def is_hash_family(path):
    name = os.path.basename(path)
    return (path.endswith(HASH_FAMILY) or name in ("CMakeLists.txt", "run", "quickstart.sh") or
            path.startswith(".ci/") and "." not in name)


class Checker:
    def __init__(self, root):
        self.root = root
        self.files = tracked_files(root)
        self.file_set = set(self.files)
        self.dirs = {""}
        for f in self.files:
            parts = f.split("/")
            for k in range(1, len(parts)):
                self.dirs.add("/".join(parts[:k]))
        self.basenames = {os.path.basename(f) for f in self.files}
        self.words = set()
        self.file_words = {}  # path: the words of its code
        self.problems = []
        self.prose = []  # (path, [(line, text)], fenced line numbers)
        self.comments = []  # (path, [(line, text)])
        for f in self.files:
            if f.startswith(SKIP_PREFIXES):
                continue
            try:
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    text = fh.read()
            except (UnicodeDecodeError, OSError):
                continue
            if any(fnmatch.fnmatch(f, g) for g in PROSE_GLOBS):
                self.prose.append((f, text))
                continue
            if f.endswith(".md"):
                continue
            if f.endswith(C_FAMILY):
                code, comments = strip_c_comments(text)
            elif is_hash_family(f):
                code, comments = strip_hash_comments(text)
            else:
                continue
            self.file_words[f] = set(WORD_RE.findall(code))
            self.words.update(self.file_words[f])
            self.comments.append((f, comments))

    def report(self, path, line, what):
        problem = "%s:%d: %s" % (path, line, what)
        if problem not in self.problems:
            self.problems.append(problem)

    def path_exists(self, ref):
        ref = ref.rstrip("/")
        if "*" in ref:
            return any(fnmatch.fnmatch(f, ref) or fnmatch.fnmatch(f, ref + "/*") for f in self.files)
        return ref in self.file_set or ref in self.dirs

    def check_paths(self, path, line, text):
        for m in PATH_RE.finditer(text):
            ref = m.group(1)
            if "..." in ref:
                ref = ref[:ref.index("...")]
            ref = ref.rstrip(".,:;")
            parts = ref.rstrip("/").split("/")
            if not self.path_exists(ref) and PLACEHOLDER_RE.search(parts[-1]):
                ref = "/".join(parts[:-1])
            if not self.path_exists(ref):
                self.report(path, line, "no such file or folder: %s" % ref)

    def check_caps(self, path, line, text):
        for name in QKV_CAPS_RE.findall(text):
            if name not in self.words:
                self.report(path, line, "no such name in the code: %s" % name)

    def check_span(self, path, line, span):
        s = span.strip()
        while True:  # drop argument lists and template arguments, innermost first
            t = re.sub(r"\([^()]*\)", "()", s)
            t = re.sub(r"<[^<>]*>", "", t)
            if t == s:
                break
            s = t
        called = s.endswith("()")
        s = s.replace("()", "")
        if not NAME_RE.match(s):
            return
        parts = re.split(r"::|\.|->", s)
        if parts[-1] in FILE_EXTENSIONS and len(parts) == 2 and "::" not in s:
            if parts[-1] in SOURCE_EXTENSIONS and s not in self.basenames:
                self.report(path, line, "no tracked file named %s" % s)
            return
        if parts[0] in FOREIGN_ROOTS or parts[0].startswith(("Vk", "vk", "gl_")):
            return
        qualified = parts[0] == "qkv" and len(parts) > 1
        for k, part in enumerate(parts):
            if qualified and k == 0:
                continue
            caps = part.isupper() or (part.upper() == part and "_" in part)
            if caps:
                if part.startswith(FOREIGN_CAPS) and not part.startswith("QKV_"):
                    continue
                check = "_" in part or part.startswith("QKV")
            elif part != part.lower():
                continue  # camelCase: a Vulkan or GLSL name
            else:
                check = "_" in part.strip("_") or qualified or (called and len(parts) == 1)
            if check and part not in self.words:
                self.report(path, line, "no such name in the code: %s (in `%s`)" % (part, span.strip()))

    def check_placed(self, path, line, text):
        for m in PLACED_RE.finditer(text):
            name, where = m.group(1), m.group(2).split(":")[0]
            if where not in self.file_words:
                continue  # not a source file of the tree (a missing one is reported as a path)
            name = re.sub(r"\(.*\)|<.*>", "", name).strip()
            if not NAME_RE.match(name):
                continue
            last = re.split(r"::|\.|->", name)[-1]
            if last not in self.file_words[where]:
                self.report(path, line, "%s is not in %s" % (last, where))

    def run(self):
        for path, text in self.prose:
            fenced = False
            for number, raw in enumerate(text.split("\n"), 1):
                if raw.lstrip().startswith("```"):
                    fenced = not fenced
                    continue
                if IGNORE_MARK in raw:
                    continue
                self.check_paths(path, number, raw)
                self.check_caps(path, number, raw)
                if not fenced:
                    self.check_placed(path, number, raw)
                    for m in SPAN_RE.finditer(raw):
                        self.check_span(path, number, m.group(2))
        for path, comments in self.comments:
            for number, text in comments:
                if IGNORE_MARK in text:
                    continue
                self.check_paths(path, number, text)
                self.check_caps(path, number, text)
                self.check_placed(path, number, text)
                for m in SPAN_RE.finditer(text):
                    self.check_span(path, number, m.group(2))
        return self.problems


def main():
    root = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--show-toplevel"],
                          check=True, capture_output=True, text=True).stdout.strip()
    checker = Checker(root)
    problems = checker.run()
    for p in problems:
        print(p)
    scanned = len(checker.prose) + len(checker.comments)
    if problems:
        print("check_references: %d stale reference(s) in %d files read" % (len(problems), scanned), file=sys.stderr)
        return 1
    print("check_references: every file and symbol cited in %d files exists" % scanned)
    return 0


if __name__ == "__main__":
    sys.exit(main())
