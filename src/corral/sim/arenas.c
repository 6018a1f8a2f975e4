/* corral.sim._arenas: pymalloc's arenas in one region the kernel may back with huge pages.

   Built by scripts/build-native into the compiled build (never into src/); turned on for a
   simulation by corral.sim.arenas.use_huge_pages(). See that module for why.

   CPython's small-object allocator (pymalloc) takes memory from the system an arena at a
   time (1 MiB in 3.11), each by its own mmap: 4 KiB pages, which the kernel backs with huge
   pages only where a process asked for them (madvise; transparent huge pages are "madvise"
   on Debian). Here the arenas are cut, one after another, from a region of address space
   reserved once (MAP_NORESERVE: nothing is committed until touched), aligned to 2 MiB and
   marked MADV_HUGEPAGE, so the objects of a run sit on 2 MiB pages and a walk over them
   misses the TLB far less often. An arena pymalloc gives back is kept for its next request
   (a list threaded through the arenas themselves); memory is never returned to the system
   while the process runs. When the region is used up, or pymalloc asks for another size,
   the allocator that was in place serves the request, and frees what it served.

   pymalloc calls these under the GIL: no locking is needed. */

#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

static PyObjectArenaAllocator previous; /* the allocator in place before: the fallback */
static char *region_start, *region_next, *region_end;
static void *returned;     /* arenas given back, each holding the next one's address */
static size_t arena_size;  /* what pymalloc asks for: its ARENA_SIZE, taken from its first ask */
static unsigned long long fresh, reused, elsewhere;
static int enabled;

static void *
arena_alloc(void *ctx, size_t size)
{
    (void)ctx;
    if (arena_size == 0) {
        arena_size = size;
    }
    if (size == arena_size) {
        if (returned != NULL) {
            void *arena = returned;
            returned = *(void **)arena;
            reused++;
            return arena;
        }
        if ((size_t)(region_end - region_next) >= size) {
            void *arena = region_next;
            region_next += size;
            fresh++;
            return arena;
        }
    }
    elsewhere++;
    return previous.alloc(previous.ctx, size);
}

static void
arena_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    char *arena = ptr;
    if (arena >= region_start && arena < region_end) {
        *(void **)ptr = returned; /* kept for the next ask: same size, as only those come here */
        returned = ptr;
        return;
    }
    previous.free(previous.ctx, ptr, size);
}

static PyObject *
enable(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    if (enabled) {
        return Py_BuildValue("(Os)", Py_True, "already on in this process");
    }
    /* Address space only (MAP_NORESERVE); a smaller reservation where a larger is refused. */
    static const size_t sizes[] = {(size_t)64 << 30, (size_t)8 << 30, (size_t)1 << 30};
    void *mapped = MAP_FAILED;
    size_t reserved = 0;
    int error = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && mapped == MAP_FAILED; i++) {
        reserved = sizes[i];
        mapped = mmap(NULL, reserved + HUGE_PAGE, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        error = errno;
    }
    if (mapped == MAP_FAILED) {
        return Py_BuildValue("(Os)", Py_False,
                             error ? strerror(error) : "mmap refused every size");
    }
    char *start = (char *)(((uintptr_t)mapped + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (madvise(start, reserved, MADV_HUGEPAGE) != 0) {
        error = errno;
        munmap(mapped, reserved + HUGE_PAGE);
        return Py_BuildValue("(Os)", Py_False, strerror(error));
    }
    region_start = region_next = start;
    region_end = start + reserved;
    PyObject_GetArenaAllocator(&previous);
    PyObjectArenaAllocator mine = {NULL, arena_alloc, arena_free};
    PyObject_SetArenaAllocator(&mine);
    enabled = 1;
    return Py_BuildValue("(Os)", Py_True, "pymalloc's arenas in a region marked for huge pages");
}

static PyObject *
stats(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return Py_BuildValue(
        "{s:O,s:K,s:K,s:K,s:n,s:n,s:n}",
        "enabled", enabled ? Py_True : Py_False,
        "fresh", fresh,
        "reused", reused,
        "elsewhere", elsewhere,
        "arena_bytes", (Py_ssize_t)arena_size,
        "used_bytes", (Py_ssize_t)(region_next - region_start),
        "region_bytes", (Py_ssize_t)(region_end - region_start));
}

static PyObject *
region(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)region_start,
                         (unsigned long long)(uintptr_t)region_end);
}

static PyMethodDef methods[] = {
    {"enable", enable, METH_NOARGS,
     "enable() -> (bool, str): serve pymalloc's arenas from a region marked for huge pages "
     "from now on, in this process (True), or why not (False)."},
    {"stats", stats, METH_NOARGS,
     "stats() -> dict: arenas served fresh from the region, reused, served elsewhere; bytes."},
    {"region", region, METH_NOARGS, "region() -> (start, end): the region's addresses (0, 0: none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_arenas",
    .m_doc = "pymalloc's arenas in one region the kernel may back with huge pages (arenas.c).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__arenas(void)
{
    return PyModule_Create(&definition);
}
