"""The one way a name from a user's file reaches generated C, OpenCL C or TIR: as an escaped
string literal (`c_string`) or as an identifier deploy made and checked (`c_identifier`); and
what `--name` may not be (`reserved`): a C or C++ keyword, a name of the C and POSIX library, or a
name the bundle's runtime and glue give (`declared_names` and `linked_names` read those from
their sources).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
"""A C identifier deploy writes: ASCII, at most 63 characters (C99's significant length)."""

_KEYWORD_WORDS = """
    auto break case char const continue default do double else enum extern float for goto if inline int
    long register restrict return short signed sizeof static struct switch typedef union unsigned void
    volatile while _Alignas _Alignof _Atomic _BitInt _Bool _Complex _Decimal128 _Decimal32 _Decimal64
    _Generic _Imaginary _Noreturn _Pragma _Static_assert _Thread_local alignas alignof bool constexpr false
    nullptr static_assert thread_local true typeof typeof_unqual asm fortran
    and and_eq bitand bitor catch char16_t char32_t char8_t class co_await co_return co_yield compl concept
    const_cast consteval constinit decltype delete dynamic_cast explicit export friend mutable namespace new
    noexcept not not_eq operator or or_eq private protected public reinterpret_cast requires static_cast
    template this throw try typeid typename using virtual wchar_t xor xor_eq
"""
C_KEYWORDS = frozenset(_KEYWORD_WORDS.split())
"""C89 to C23 keywords, GNU's, and C++'s (NAME.h is included from C++ too)."""

_LIBRARY_WORDS = """
    main errno NULL EOF BUFSIZ FILENAME_MAX stdin stdout stderr assert offsetof va_list va_start va_arg
    va_end va_copy setjmp longjmp jmp_buf sigjmp_buf sigsetjmp siglongjmp environ
    size_t ssize_t ptrdiff_t intptr_t uintptr_t intmax_t uintmax_t max_align_t wchar_t wint_t wctype_t
    mbstate_t off_t pid_t uid_t gid_t mode_t dev_t ino_t nlink_t time_t clock_t clockid_t timer_t
    suseconds_t useconds_t blksize_t blkcnt_t fsblkcnt_t fsfilcnt_t id_t key_t locale_t socklen_t
    sig_atomic_t sigset_t fd_set div_t ldiv_t lldiv_t fpos_t FILE DIR fenv_t fexcept_t float_t double_t
    int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t int_least8_t int_least16_t
    int_least32_t int_least64_t uint_least8_t uint_least16_t uint_least32_t uint_least64_t int_fast8_t
    int_fast16_t int_fast32_t int_fast64_t uint_fast8_t uint_fast16_t uint_fast32_t uint_fast64_t
    INT8_MAX INT16_MAX INT32_MAX INT64_MAX INT8_MIN INT16_MIN INT32_MIN INT64_MIN UINT8_MAX UINT16_MAX
    UINT32_MAX UINT64_MAX SIZE_MAX INTPTR_MAX UINTPTR_MAX PTRDIFF_MAX INTMAX_MAX UINTMAX_MAX CHAR_BIT
    CHAR_MAX CHAR_MIN SCHAR_MAX SCHAR_MIN UCHAR_MAX SHRT_MAX SHRT_MIN USHRT_MAX INT_MAX INT_MIN UINT_MAX
    LONG_MAX LONG_MIN ULONG_MAX LLONG_MAX LLONG_MIN ULLONG_MAX FLT_MAX FLT_MIN FLT_EPSILON DBL_MAX DBL_MIN
    DBL_EPSILON PATH_MAX NAME_MAX PIPE_BUF INFINITY NAN HUGE_VAL HUGE_VALF M_PI M_E EXIT_SUCCESS
    EXIT_FAILURE RAND_MAX MB_CUR_MAX CLOCKS_PER_SEC TIME_UTC SEEK_SET SEEK_CUR SEEK_END EDOM ERANGE EILSEQ
    EINVAL ENOMEM EAGAIN EINTR ENOENT EEXIST EACCES EPERM EBADF EBUSY EFAULT EIO ENOSPC EPIPE ETIMEDOUT
    SIGINT SIGTERM SIGKILL SIGSEGV SIGABRT SIGFPE SIGILL SIGBUS SIGPIPE SIGCHLD SIGALRM SIGHUP SIGUSR1
    SIGUSR2 SIG_DFL SIG_IGN SIG_ERR O_RDONLY O_WRONLY O_RDWR O_CREAT O_EXCL O_TRUNC O_APPEND O_NONBLOCK
    malloc calloc realloc free aligned_alloc posix_memalign memalign valloc alloca abort exit _Exit
    quick_exit atexit at_quick_exit getenv setenv unsetenv putenv system abs labs llabs div ldiv lldiv atoi
    atol atoll atof strtol strtoll strtoul strtoull strtod strtof strtold rand srand random srandom qsort
    bsearch mblen mbtowc wctomb mbstowcs wcstombs realpath mkstemp mkdtemp
    memcpy memmove memset memcmp memchr memccpy mempcpy memmem memrchr strcpy strncpy strcat strncat
    strcmp strncmp strcoll strxfrm strchr strrchr strstr strspn strcspn strpbrk strtok strtok_r strlen
    strnlen strdup strndup strerror strerror_r strsignal strsep strcasecmp strncasecmp stpcpy stpncpy
    bzero bcopy bcmp index rindex ffs explicit_bzero
    printf fprintf sprintf snprintf vprintf vfprintf vsprintf vsnprintf dprintf vdprintf asprintf
    vasprintf scanf fscanf sscanf vscanf vfscanf vsscanf fopen freopen fclose fflush fread fwrite fgetc
    fgets fputc fputs getc getchar gets putc putchar puts ungetc fseek ftell rewind fgetpos fsetpos feof
    ferror clearerr perror remove rename tmpfile tmpnam setbuf setvbuf fileno fdopen popen pclose getline
    getdelim flockfile funlockfile
    sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh exp exp2 expm1 log log2 log10 log1p
    logb pow sqrt cbrt hypot erf erfc tgamma lgamma ceil floor round lround llround trunc rint lrint llrint
    nearbyint fmod remainder remquo fabs fmax fmin fdim fma frexp ldexp modf scalbn scalbln ilogb copysign
    nan nextafter nexttoward isnan isinf isfinite isnormal signbit fpclassify expf logf sqrtf powf sinf
    cosf tanhf fabsf floorf ceilf roundf fmaxf fminf fmaf erff exp10 sincos
    isalnum isalpha isblank iscntrl isdigit isgraph islower isprint ispunct isspace isupper isxdigit
    tolower toupper isascii toascii
    time clock difftime mktime gmtime localtime gmtime_r localtime_r asctime ctime strftime strptime
    timespec_get clock_gettime clock_settime clock_getres clock_nanosleep nanosleep sleep usleep
    gettimeofday timespec timeval tm
    signal raise sigaction sigemptyset sigfillset sigaddset sigdelset sigismember sigprocmask sigsuspend
    kill killpg alarm pause
    open openat close read write pread pwrite lseek dup dup2 pipe fcntl ioctl fsync fdatasync ftruncate
    truncate unlink unlinkat link symlink readlink mkdir rmdir chdir fchdir getcwd access faccessat stat
    fstat lstat fstatat chmod fchmod chown fchown umask mkfifo mknod opendir readdir closedir rewinddir
    dirfd fork vfork execl execle execlp execv execve execvp wait waitpid waitid _exit getpid getppid
    getuid geteuid getgid getegid setuid setgid setsid getpgid isatty ttyname sysconf pathconf
    fpathconf confstr getopt optarg optind opterr optopt mmap munmap mprotect msync madvise mlock munlock
    shm_open shm_unlink select poll socket bind listen accept connect send recv sendto recvfrom shutdown
    getaddrinfo freeaddrinfo gai_strerror inet_pton inet_ntop htons htonl ntohs ntohl
    dlopen dlclose dlsym dlerror dladdr sched_yield sched_getaffinity sched_setaffinity getrlimit
    setrlimit getrusage uname syslog openlog closelog
    pthread_create pthread_join pthread_detach pthread_exit pthread_self pthread_equal pthread_cancel
    pthread_once pthread_key_create pthread_key_delete pthread_getspecific pthread_setspecific
    pthread_mutex_init pthread_mutex_destroy pthread_mutex_lock pthread_mutex_trylock pthread_mutex_unlock
    pthread_cond_init pthread_cond_destroy pthread_cond_wait pthread_cond_timedwait pthread_cond_signal
    pthread_cond_broadcast pthread_attr_init pthread_attr_destroy pthread_t pthread_attr_t
    pthread_mutex_t pthread_cond_t pthread_key_t pthread_once_t
    sem_init sem_destroy sem_wait sem_post sem_open sem_close sem_t
    thrd_create thrd_join thrd_exit thrd_current thrd_t mtx_init mtx_lock mtx_unlock mtx_destroy mtx_t
    cnd_init cnd_wait cnd_signal cnd_broadcast cnd_t tss_create tss_get tss_set tss_t call_once once_flag
    atomic_int atomic_uint atomic_bool atomic_flag atomic_load atomic_store atomic_exchange
    atomic_fetch_add atomic_fetch_sub atomic_compare_exchange_strong atomic_compare_exchange_weak
    memory_order atomic_thread_fence kill_dependency
    setlocale localeconv wcslen wcscpy wcscmp wprintf fwprintf swprintf btowc wctob mbrtowc wcrtomb
    static_assert noreturn complex imaginary I
"""
C_LIBRARY = frozenset(_LIBRARY_WORDS.split())
"""Names of the C and POSIX library (functions, objects, types, macros): a program that links a
bundle, or the bundle's own runtime, uses them."""

_RESERVED_BY = (
    ("_", "_", "the C implementation's"),
    ("deploy_|DEPLOY_|Deploy", "deploy_, DEPLOY_ or Deploy", "deploy's runtime's"),
    ("TVM|tvm", "TVM or tvm", "TVM's"),
    ("kDL|DL[A-Z_]", "kDL, or DL and a capital or _", "DLPack's"),
    ("pthread_|PTHREAD_", "pthread_ or PTHREAD_", "POSIX threads'"),
    ("cl_|CL_", "cl_ or CL_", "OpenCL's"),
    (r"k\d+_", "k<digits>_", "the kernels'"),
)
"""Names reserved by how they begin, each for a collision a real build meets: (pattern, as a
message shows it, whose). The runtime's and glue's types and functions (DeployTensorSpec,
deploy_rt1_scratch), TVM's (TVMBackend...), dlpack.h's types, enums and macros (DLTensor, kDLCPU,
DLPACK_DLL), pthread.h's, CL/cl.h's (cl_mem, CL_SUCCESS: an OpenCL bundle's NAME.h includes it),
and the kernels' own symbols (k0_add)."""
_KEPT = frozenset(ord(c) for c in '\\"?*/')
"""Printable ASCII a literal still escapes: `\\` and `"` (the literal's own), `?` (no trigraph
`??/`), and `*` and `/` (no `*/` or `/*` when the literal stands in a comment)."""


def c_string(text: str) -> str:
    """`text` as a C string literal safe in C code and in a C comment: printable ASCII kept, but for
    backslash, quote, `?`, `*` and `/`; every other byte of its UTF-8 (newlines, NUL, U+2028) as
    a 3-digit octal escape (a hex escape would run on into a following digit)."""
    out = []
    for byte in text.encode("utf-8", "surrogatepass"):
        if byte in (0x5C, 0x22):
            out.append("\\" + chr(byte))
        elif byte == 0x3F:
            out.append("\\?")
        elif 0x20 <= byte < 0x7F and byte not in _KEPT:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def why_reserved(name: str, declared: frozenset[str] = frozenset()) -> str | None:
    """Why `name` cannot be a C name deploy writes: a keyword, a library name, one of `declared`
    (the runtime's and glue's), a reserved beginning, or the end of TVM's parallel closures
    (main_compute_); None when it can."""
    if name in C_KEYWORDS:
        return "a C or C++ keyword"
    if name in C_LIBRARY:
        return "a name of the C or POSIX library"
    if name in declared:
        return "a name deploy's bundle runtime or glue gives"
    for pattern, shown, whose in _RESERVED_BY:
        if re.fullmatch(f"(?:{pattern}).*", name):
            return f"reserved (names that begin {shown} are {whose})"
    if name.endswith("_compute_"):
        return "reserved (names that end _compute_ are TVM's parallel closures')"
    return None


def reserved(name: str, declared: frozenset[str] = frozenset()) -> bool:
    """Whether `name` is a keyword, a library name, a name in `declared`, or begins as reserved."""
    return why_reserved(name, declared) is not None


def c_word(text: str, most: int = 48) -> str:
    """`text` as letters, digits and `_` (ASCII; anything else as `_`), at most `most` of them, or
    `t` for none: a part of a name deploy makes (`node0_` + it)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)[:most] or "t"


def c_identifier(text: str, taken: set[str], declared: frozenset[str] = frozenset(), most: int = 48) -> str:
    """A C identifier deploy makes from `text` (a name from a user's file): ASCII letters, digits
    and `_` kept (at most `most`), anything else as `_`; prefixed `t_` when it would begin with a
    digit or be `reserved`; numbered to be unique among `taken` ignoring case (macros upper-case
    it), which it joins."""
    base = c_word(text, most)
    if base[0].isdigit() or reserved(base, declared):
        base = f"t_{base}"
    chosen, count = base, 1
    while chosen.lower() in taken or reserved(chosen, declared):
        count += 1
        chosen = f"{base}_{count}"
    assert IDENTIFIER.fullmatch(chosen), chosen
    taken.add(chosen.lower())
    return chosen


_TEXT = re.compile(r'("(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')|/\*.*?\*/|//[^\n]*', re.S)
"""A string or character literal (group 1), or a comment: read in one pass, so that neither hides
the other."""
_WORD = re.compile(r"\b[A-Za-z_]\w*")
_ENTRY_PARAMS = ("DEPLOY_PARAMS", "DEPLOY_SYMBOL_PARAMS", "DEPLOY_CL_PARAMS")
_PARAMS = re.compile(r"(?<=[\w)])\([^()]*\)?")
"""A parameter list (or a macro's arguments): what follows a name or `)` directly."""
_DEFINED = re.compile(r"#\s*define\s+(\w+)")


def _blank(match: re.Match[str]) -> str:
    """A literal as `""`, a comment as the line breaks it held (lines stay where they were)."""
    return '""' if match.group(1) else "\n" * match.group(0).count("\n") or " "


def declared_names(sources: Iterable[str]) -> frozenset[str]:
    """The names C `sources` give at file scope, as a regular reading finds them: the identifiers
    of each line that begins in column 0 (declarations, definitions, `} Name;`) but for its
    parameter lists, each macro `#define` names, and every identifier of a function that takes
    a bundle's tensors or symbolic dims (`DEPLOY_PARAMS`...: a parameter named as one of its
    own, a local or a callee would not compile). Deploy's C keeps its file-scope declarations
    in column 0, so this holds more than the exact set rather than fewer."""
    found: set[str] = set()
    for source in sources:
        body = False
        for line in _TEXT.sub(_blank, source).splitlines():
            if line.startswith("#"):
                found.update(_DEFINED.findall(line))
            elif line[:1].isalpha() or line[:1] in "_}":
                body = any(p in line for p in _ENTRY_PARAMS)
                found.update(_WORD.findall(line if body else _PARAMS.sub("", line)))
                body = body and not line.rstrip().endswith("}")
            elif body:
                found.update(_WORD.findall(line))
    return frozenset(found)


def linked_names(sources: Iterable[str]) -> frozenset[str]:
    """The names C `sources` that do not include NAME.h give the other objects of a bundle: the
    identifiers of each column-0 declaration that is not `static` and no type (its macros, types
    and statics are its own: they stay local to its object through `ld -r`), but for its
    parameter lists, initializers and bodies."""
    found: set[str] = set()
    for source in sources:
        for line in _TEXT.sub(_blank, source).splitlines():
            words = _WORD.findall(re.split("[={]", _PARAMS.sub("", line))[0])
            if (line[:1].isalpha() or line[:1] == "_") and not {"static", "typedef"} & set(words):
                found.update(words)
    return frozenset(found)
