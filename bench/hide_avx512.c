/* Hide AVX-512 from CPUID, so that a process on an AVX-512 host picks the kernels it would on an
 * AVX2 host: onnxruntime's MLAS, numpy's and OpenBLAS's dispatch and PyTorch's all ask CPUID
 * (leaf 7) which vector extensions the CPU has. `bench/harness.py` (`--avx2-host`) builds this
 * with the host's cc and sets it as LD_PRELOAD for the processes that time.
 *
 * Linux's CPUID faulting (`arch_prctl(ARCH_SET_CPUID, 0)`; `cpuid_fault` in /proc/cpuinfo) makes
 * each CPUID instruction of the thread raise SIGSEGV. The handler below runs the real CPUID with
 * faulting off for that one instruction, clears the AVX-512 bits of leaf 7 in the result, and
 * steps past the instruction (0F A2, two bytes). The setting is per thread and inherited by the
 * threads and processes it starts (execve resets it; LD_PRELOAD sets it again there). XGETBV is
 * not trapped: programs test the CPUID bit and the OS's register state both, so clearing the bit
 * is enough. Code built for AVX-512 still runs: only what the CPU says changes.
 *
 * A library that sets its own SIGSEGV handler later (TVM's, which prints a backtrace) would take
 * the next CPUID's fault: `sigaction` and `signal` are wrapped here so that ours stays, and the
 * handler set after it gets every other fault instead. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* Leaf 7, subleaf 0: EBX F, DQ, IFMA, PF, ER, CD, BW, VL; ECX VBMI, VBMI2, VNNI, BITALG,
 * VPOPCNTDQ; EDX 4VNNIW, 4FMAPS, VP2INTERSECT, FP16. Subleaf 1: EAX BF16. */
#define LEAF7_EBX ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31))
#define LEAF7_ECX ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
#define LEAF7_EDX ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 23))
#define LEAF7_1_EAX (1u << 5)

static struct sigaction previous; /* who handles any other SIGSEGV: set before us, or after */
static int installed;             /* whether ours is SIGSEGV's handler */

typedef int sigaction_fn(int, const struct sigaction *, struct sigaction *);

static sigaction_fn *real_sigaction(void) {
  static sigaction_fn *real;
  if (real == NULL) real = (sigaction_fn *)dlsym(RTLD_NEXT, "sigaction");
  return real;
}

/* SIGSEGV's handler as the program sees it: `previous`; ours stays in place. */
int sigaction(int sig, const struct sigaction *action, struct sigaction *old) {
  if (sig != SIGSEGV || !installed) return real_sigaction()(sig, action, old);
  if (old != NULL) *old = previous;
  if (action != NULL) previous = *action;
  return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction action, old;
  memset(&action, 0, sizeof action);
  action.sa_handler = handler;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  return sigaction(sig, &action, &old) == 0 ? old.sa_handler : SIG_ERR;
}

static void on_segv(int sig, siginfo_t *info, void *context) {
  greg_t *reg = ((ucontext_t *)context)->uc_mcontext.gregs;
  const unsigned char *at = (const unsigned char *)reg[REG_RIP];
  if (info->si_code != SI_KERNEL || at[0] != 0x0f || at[1] != 0xa2) {
    installed = 0; /* not a CPUID: it faults again, into the program's own handler */
    real_sigaction()(sig, &previous, NULL);
    return;
  }
  unsigned leaf = (unsigned)reg[REG_RAX], sub = (unsigned)reg[REG_RCX], a, b, c, d;
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  __cpuid_count(leaf, sub, a, b, c, d);
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  if (leaf == 7 && sub == 0) {
    b &= ~LEAF7_EBX;
    c &= ~LEAF7_ECX;
    d &= ~LEAF7_EDX;
  } else if (leaf == 7 && sub == 1) {
    a &= ~LEAF7_1_EAX;
  }
  reg[REG_RAX] = a;
  reg[REG_RBX] = b;
  reg[REG_RCX] = c;
  reg[REG_RDX] = d;
  reg[REG_RIP] += 2;
}

__attribute__((constructor)) static void hide_avx512(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  if (real_sigaction()(SIGSEGV, &action, &previous) == 0 && syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) == 0)
    installed = 1;
}
