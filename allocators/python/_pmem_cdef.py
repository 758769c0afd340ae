# _pmem_cdef.py -- the cffi declarations of librtkit_pmem.so, generated from its public header (rtkit/pmem.h).
"""allocators/build.py copies allocators/include/rtkit/pmem.h beside the library it builds, as librtkit_pmem.h,
so the declarations always come from the build that is loaded. cffi's parser takes plain C declarations
only: comments, the include guard, #include and #define lines and the C++ `extern "C"` wrapper are removed
here; the enums stay (cffi evaluates them, so lib.RTKIT_PMEM_EINVAL etc. are the header's values)."""
import os
import re

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_DIRECTIVE = re.compile(r"#\s*(\w+)\s*(\w*)")


class CdefError(ValueError):
    """The header uses a preprocessor construct this reader does not evaluate."""


def header_path(library_path: str) -> str:
    """The header build.py copies beside a library: librtkit_pmem.so -> librtkit_pmem.h."""
    return os.path.splitext(library_path)[0] + ".h"


def cdef_from_header(text: str, where: str = "pmem.h") -> str:
    """Plain C declarations of a header: comments removed, conditionals evaluated with nothing defined but
    the header's own macros (so `#ifndef GUARD` is kept and `#ifdef __cplusplus` is dropped), directives removed."""
    text = _COMMENT.sub(" ", text.replace("\\\n", " "))
    defined = set()
    stack = []  # one entry per open conditional: is its current branch kept?
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped.startswith("#"):
            if all(stack) and stripped:
                out.append(line.rstrip())
            continue
        m = _DIRECTIVE.match(stripped)
        word, name = (m.group(1), m.group(2)) if m else ("", "")
        if word in ("ifdef", "ifndef"):
            stack.append((name in defined) == (word == "ifdef"))
        elif word == "else" and stack:
            stack[-1] = not stack[-1]
        elif word == "endif" and stack:
            stack.pop()
        elif word in ("define", "undef"):
            if all(stack):
                (defined.add if word == "define" else defined.discard)(name)
        elif word in ("include", "pragma"):
            pass
        else:
            raise CdefError(f"{where}:{number}: '#{word}' is not understood by the cffi declaration reader "
                            "(allocators/python/_pmem_cdef.py): use #ifdef/#ifndef/#else/#endif only")
    if stack:
        raise CdefError(f"{where}: unterminated #if block")
    return "\n".join(out) + "\n"


def cdef_for_library(library_path: str) -> str:
    path = header_path(library_path)
    with open(path) as fh:
        return cdef_from_header(fh.read(), path)
