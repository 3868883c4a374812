/*
 * GPU memory bandwidth, measured where it runs: a device-to-device copy kernel, written in PTX
 * below and JIT-compiled by the driver, launched through the CUDA driver API and timed with CUDA
 * events. The driver is opened at run time (dlopen("libcuda.so.1")), so building this needs only
 * a C compiler (`cc -O2 -o bandwidth bandwidth.c -ldl`): no nvcc, no CUDA headers, no CUDA image.
 * The same binary runs on the host and inside a sandbox, so the two figures compare like with like.
 *
 *   bandwidth [--bytes N] [--iters N] [--reps N] [--device N]
 *   bandwidth --ptx     prints the kernel's PTX (to check it with ptxas where there is no GPU)
 *
 * Prints one JSON line on stdout. Every copy reads and writes `bytes`, so one launch moves
 * 2 * bytes; GB/s = 1e9 bytes per second. `gbps` is the best of `reps` timed runs of `iters`
 * launches each, `gbpsMedian` their median. The copied buffer is checked afterwards.
 *
 * Exit codes: 0 measured; 2 no CUDA driver (libcuda.so.1 cannot be loaded); 3 the driver found
 * no usable GPU; 4 a CUDA call failed; 5 the copy produced wrong data; 64 bad arguments. On every
 * failure the JSON line has "error", and stderr says the same in words.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUevent;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

/* copy16(src, dst, n): dst[i] = src[i] for n 16-byte elements, grid-stride loop. */
static const char PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry copy16(\n"
    "  .param .u64 copy16_src,\n"
    "  .param .u64 copy16_dst,\n"
    "  .param .u64 copy16_n\n"
    ")\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<9>;\n"
    "  .reg .b64 %rd<10>;\n"
    "\n"
    "  ld.param.u64 %rd1, [copy16_src];\n"
    "  ld.param.u64 %rd2, [copy16_dst];\n"
    "  ld.param.u64 %rd3, [copy16_n];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    "  cvta.to.global.u64 %rd2, %rd2;\n"
    "  mov.u32 %r1, %ctaid.x;\n"
    "  mov.u32 %r2, %ntid.x;\n"
    "  mov.u32 %r3, %tid.x;\n"
    "  mov.u32 %r4, %nctaid.x;\n"
    "  mul.wide.u32 %rd4, %r1, %r2;\n"
    "  cvt.u64.u32 %rd5, %r3;\n"
    "  add.u64 %rd4, %rd4, %rd5;\n"
    "  mul.wide.u32 %rd6, %r4, %r2;\n"
    "$Lloop:\n"
    "  setp.ge.u64 %p1, %rd4, %rd3;\n"
    "  @%p1 bra $Ldone;\n"
    "  shl.b64 %rd7, %rd4, 4;\n"
    "  add.u64 %rd8, %rd1, %rd7;\n"
    "  add.u64 %rd9, %rd2, %rd7;\n"
    "  ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd8];\n"
    "  st.global.v4.u32 [%rd9], {%r5, %r6, %r7, %r8};\n"
    "  add.u64 %rd4, %rd4, %rd6;\n"
    "  bra.uni $Lloop;\n"
    "$Ldone:\n"
    "  ret;\n"
    "}\n";

/* The driver entry points used, resolved by name. */
static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int *);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*DeviceTotalMem)(size_t *, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxSynchronize)(void);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*ModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *, void **);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*EventCreate)(CUevent *, unsigned);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
} cu;

/* Writes the JSON error line and the same words on stderr, then exits. */
static void fail(int code, const char *what, const char *detail) {
  printf("{\"error\":\"%s\",\"detail\":\"", what);
  for (const char *c = detail ? detail : ""; *c; c++) {
    if (*c == '"' || *c == '\\')
      printf("\\%c", *c);
    else if ((unsigned char)*c < 0x20)
      printf(" ");
    else
      putchar(*c);
  }
  printf("\"}\n");
  fprintf(stderr, "bandwidth: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(code);
}

static void check(CUresult r, const char *call) {
  if (r == 0) return;
  const char *text = NULL;
  if (cu.GetErrorString) cu.GetErrorString(r, &text);
  char buf[512];
  snprintf(buf, sizeof buf, "%s returned %d (%s)", call, r, text ? text : "unknown error");
  /* 100: CUDA_ERROR_NO_DEVICE; 999 and 3 (not initialised) also mean no usable GPU. */
  fail(r == 100 ? 3 : 4, r == 100 ? "no CUDA device" : "CUDA call failed", buf);
}

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) fail(2, "no CUDA driver", name);
  return p;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  size_t bytes = 0;
  int iters = 20, reps = 5, ordinal = 0;
  if (argc == 2 && !strcmp(argv[1], "--ptx")) {
    fputs(PTX, stdout);
    return 0;
  }
  for (int i = 1; i < argc; i++) {
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--bytes") && next) bytes = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--iters") && next) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && next) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && next) ordinal = atoi(argv[++i]);
    else fail(64, "bad arguments", "usage: bandwidth [--bytes N] [--iters N] [--reps N] [--device N]");
  }
  if (iters < 1 || reps < 1 || reps > 100 || ordinal < 0) fail(64, "bad arguments", "iters, reps >= 1");

  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) fail(2, "no CUDA driver", dlerror());
  *(void **)&cu.Init = sym(lib, "cuInit");
  *(void **)&cu.DriverGetVersion = sym(lib, "cuDriverGetVersion");
  *(void **)&cu.GetErrorString = sym(lib, "cuGetErrorString");
  *(void **)&cu.DeviceGetCount = sym(lib, "cuDeviceGetCount");
  *(void **)&cu.DeviceGet = sym(lib, "cuDeviceGet");
  *(void **)&cu.DeviceGetName = sym(lib, "cuDeviceGetName");
  *(void **)&cu.DeviceGetAttribute = sym(lib, "cuDeviceGetAttribute");
  *(void **)&cu.DeviceTotalMem = sym(lib, "cuDeviceTotalMem_v2");
  *(void **)&cu.DevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&cu.DevicePrimaryCtxRelease = sym(lib, "cuDevicePrimaryCtxRelease_v2");
  *(void **)&cu.CtxSetCurrent = sym(lib, "cuCtxSetCurrent");
  *(void **)&cu.CtxSynchronize = sym(lib, "cuCtxSynchronize");
  *(void **)&cu.MemAlloc = sym(lib, "cuMemAlloc_v2");
  *(void **)&cu.MemFree = sym(lib, "cuMemFree_v2");
  *(void **)&cu.MemsetD8 = sym(lib, "cuMemsetD8_v2");
  *(void **)&cu.MemcpyDtoH = sym(lib, "cuMemcpyDtoH_v2");
  *(void **)&cu.ModuleLoadDataEx = sym(lib, "cuModuleLoadDataEx");
  *(void **)&cu.ModuleGetFunction = sym(lib, "cuModuleGetFunction");
  *(void **)&cu.LaunchKernel = sym(lib, "cuLaunchKernel");
  *(void **)&cu.EventCreate = sym(lib, "cuEventCreate");
  *(void **)&cu.EventRecord = sym(lib, "cuEventRecord");
  *(void **)&cu.EventSynchronize = sym(lib, "cuEventSynchronize");
  *(void **)&cu.EventElapsedTime = sym(lib, "cuEventElapsedTime");

  check(cu.Init(0), "cuInit");
  int version = 0, count = 0;
  check(cu.DriverGetVersion(&version), "cuDriverGetVersion");
  check(cu.DeviceGetCount(&count), "cuDeviceGetCount");
  if (count == 0) fail(3, "no CUDA device", "the driver sees no GPU");
  if (ordinal >= count) fail(64, "bad arguments", "--device is beyond the GPUs the driver sees");
  CUdevice dev;
  check(cu.DeviceGet(&dev, ordinal), "cuDeviceGet");
  char name[256] = {0};
  int sms = 0;
  size_t total = 0;
  check(cu.DeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName");
  check(cu.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
        "cuDeviceGetAttribute");
  check(cu.DeviceTotalMem(&total, dev), "cuDeviceTotalMem");
  if (bytes == 0) bytes = total >= (8ULL << 30) ? (1ULL << 30) : total / 8;
  bytes &= ~(size_t)15;
  if (bytes < 16) fail(64, "bad arguments", "--bytes must be at least 16");

  CUcontext ctx;
  check(cu.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");

  char log[8192] = {0};
  int opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[] = {log, (void *)(uintptr_t)(sizeof log - 1)};
  CUmodule mod;
  CUresult r = cu.ModuleLoadDataEx(&mod, PTX, 2, opts, vals);
  if (r != 0) {
    char buf[8400];
    snprintf(buf, sizeof buf, "cuModuleLoadDataEx returned %d: %s", r, log);
    fail(4, "the driver refused the PTX", buf);
  }
  CUfunction fn;
  check(cu.ModuleGetFunction(&fn, mod, "copy16"), "cuModuleGetFunction");

  CUdeviceptr src, dst;
  check(cu.MemAlloc(&src, bytes), "cuMemAlloc");
  check(cu.MemAlloc(&dst, bytes), "cuMemAlloc");
  check(cu.MemsetD8(src, 0xA5, bytes), "cuMemsetD8");
  check(cu.MemsetD8(dst, 0x00, bytes), "cuMemsetD8");

  unsigned long long n = bytes / 16;
  unsigned threads = 256;
  unsigned long long want = (n + threads - 1) / threads;
  unsigned long long cap = (unsigned long long)(sms > 0 ? sms : 1) * 32;
  unsigned blocks = (unsigned)(want < cap ? want : cap);
  void *params[] = {&src, &dst, &n};

  for (int i = 0; i < 3; i++)
    check(cu.LaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
  check(cu.CtxSynchronize(), "cuCtxSynchronize");

  CUevent start, stop;
  check(cu.EventCreate(&start, 0), "cuEventCreate");
  check(cu.EventCreate(&stop, 0), "cuEventCreate");
  float gbps[100];
  float total_ms = 0;
  for (int rep = 0; rep < reps; rep++) {
    check(cu.EventRecord(start, NULL), "cuEventRecord");
    for (int i = 0; i < iters; i++)
      check(cu.LaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, NULL, params, NULL),
            "cuLaunchKernel");
    check(cu.EventRecord(stop, NULL), "cuEventRecord");
    check(cu.EventSynchronize(stop), "cuEventSynchronize");
    float ms = 0;
    check(cu.EventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    total_ms += ms;
    gbps[rep] = (float)(2.0 * (double)bytes * iters / (ms / 1000.0) / 1e9);
  }

  /* The copy must have happened: the first and last 4 KiB of dst hold src's pattern. */
  unsigned char probe[4096];
  size_t len = bytes < sizeof probe ? bytes : sizeof probe;
  for (int end = 0; end < 2; end++) {
    check(cu.MemcpyDtoH(probe, dst + (end ? bytes - len : 0), len), "cuMemcpyDtoH");
    for (size_t i = 0; i < len; i++)
      if (probe[i] != 0xA5) fail(5, "wrong data", "the copy kernel did not copy the buffer");
  }

  float best = gbps[0];
  for (int i = 1; i < reps; i++)
    if (gbps[i] > best) best = gbps[i];
  qsort(gbps, (size_t)reps, sizeof gbps[0], cmp_float);
  float median = gbps[reps / 2];

  printf("{\"device\":\"");
  for (const char *c = name; *c; c++)
    if (*c != '"' && *c != '\\') putchar(*c);
  printf("\",\"driverVersion\":%d,\"bytes\":%zu,\"iters\":%d,\"reps\":%d,\"blocks\":%u,"
         "\"threads\":%u,\"ms\":%.3f,\"gbps\":%.1f,\"gbpsMedian\":%.1f}\n",
         version, bytes, iters, reps, blocks, threads, total_ms, best, median);

  cu.MemFree(src);
  cu.MemFree(dst);
  cu.DevicePrimaryCtxRelease(dev);
  return 0;
}
