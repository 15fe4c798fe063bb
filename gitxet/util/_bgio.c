/*
 * Background reads on a thread that never takes the interpreter lock.
 *
 * A mount serves every request on one thread that holds the interpreter lock; a Python
 * helper thread cannot take a copy off it (it needs the lock to start and to finish each
 * job). A Worker owns one pthread and a bounded job queue; a job is a pread() of a range
 * of a file (through a dup() of the caller's descriptor, so a descriptor closed and its
 * number reused meanwhile is never read) into memory the thread allocates, handed back as
 * a read-only Block (no copy). The thread never touches a Python object: done jobs go on
 * a list that reap() (with the lock) turns into results; an eventfd (fileno()) says when
 * there are some. stop() waits a bounded time for a read in progress, then abandons it.
 * In a forked child (no thread there) a Worker refuses reads and is never stopped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

typedef struct job {
    struct job *next;
    unsigned long long token;
    uint64_t offset;
    int rfd;          /* a dup of the caller's descriptor */
    size_t size;
    char *mem;        /* the bytes read (malloc'd by the thread) */
    long long result; /* bytes read or -errno */
} job;

/* shared between the Python object and the pthread (freed by whichever leaves last) */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t gone;
    job *head, *tail; /* queued */
    job *done;        /* written (or failed), buffers still held */
    unsigned queued, limit;
    int efd;
    int stopping, running, abandoned;
} shared;

typedef struct {
    PyObject_HEAD
    shared *s;
    pthread_t thread;
    int started;
    pid_t pid; /* the process whose thread it is (a forked child has no thread) */
} Worker;

static void signal_done(int efd) {
    uint64_t one = 1;
    ssize_t r;
    do {
        r = write(efd, &one, sizeof one);
    } while (r < 0 && errno == EINTR);
}

static long long read_one(job *j) {
    j->mem = malloc(j->size ? j->size : 1);
    if (!j->mem)
        return -ENOMEM;
    size_t got = 0;
    while (got < j->size) {
        ssize_t r = pread(j->rfd, j->mem + got, j->size - got, (off_t)(j->offset + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -(long long)errno;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (long long)got;
}

static void free_shared(shared *s) {
    /* jobs left here hold buffers only when the thread was abandoned: leaked on purpose */
    if (s->efd >= 0)
        close(s->efd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->gone);
    PyMem_RawFree(s);
}

static void *worker(void *arg) {
    shared *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->wake, &s->mu);
        if (s->stopping)
            break;
        job *j = s->head;
        s->head = j->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        j->result = read_one(j);
        close(j->rfd);
        j->rfd = -1;
        pthread_mutex_lock(&s->mu);
        j->next = s->done;
        s->done = j;
        signal_done(s->efd);
    }
    s->running = 0;
    pthread_cond_broadcast(&s->gone);
    int abandoned = s->abandoned;
    pthread_mutex_unlock(&s->mu);
    if (abandoned)
        free_shared(s); /* the Python side let go of it */
    return NULL;
}

static PyObject *Worker_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"limit", NULL};
    unsigned limit = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|I", kwlist, &limit))
        return NULL;
    if (limit == 0) {
        PyErr_SetString(PyExc_ValueError, "limit must be positive");
        return NULL;
    }
    Worker *self = (Worker *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    shared *s = PyMem_RawCalloc(1, sizeof *s);
    if (!s) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    s->efd = -1;
    s->limit = limit;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->gone, NULL);
    self->s = s;
    s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    s->running = 1;
    int err = pthread_create(&self->thread, NULL, worker, s);
    if (err) {
        s->running = 0;
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    self->started = 1;
    self->pid = getpid();
    return (PyObject *)self;
}

static void release_list(job *j) {
    while (j) {
        job *next = j->next;
        if (j->rfd >= 0)
            close(j->rfd);
        free(j->mem);
        PyMem_RawFree(j);
        j = next;
    }
}

/* ---- Block: a read's bytes, owned (freed with it), read-only ---- */

typedef struct {
    PyObject_HEAD
    char *mem;
    Py_ssize_t len;
    Py_ssize_t exports;
} Block;

static void Block_dealloc(Block *self) {
    free(self->mem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Block_getbuffer(Block *self, Py_buffer *view, int flags) {
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->mem, self->len, 1, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void Block_releasebuffer(Block *self, Py_buffer *view) {
    (void)view;
    self->exports--;
}

static Py_ssize_t Block_len(Block *self) { return self->len; }

static PyBufferProcs Block_as_buffer = {
    (getbufferproc)Block_getbuffer,
    (releasebufferproc)Block_releasebuffer,
};

static PySequenceMethods Block_as_sequence = {.sq_length = (lenfunc)Block_len};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gitxet.util._bgio.Block",
    .tp_as_buffer = &Block_as_buffer,
    .tp_as_sequence = &Block_as_sequence,
    .tp_basicsize = sizeof(Block),
    .tp_doc = "bytes a Worker read (read-only buffer)",
    .tp_dealloc = (destructor)Block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

static int enqueue(shared *s, job *j) {
    pthread_mutex_lock(&s->mu);
    int ok = !s->stopping && s->queued < s->limit;
    if (ok) {
        s->queued++;
        if (s->tail)
            s->tail->next = j;
        else
            s->head = j;
        s->tail = j;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Stop the thread: wait up to `timeout` seconds for a read in progress, then abandon it.
 * Returns 1 when joined (every buffer released), 0 when abandoned. GIL held on entry. */
static int stop_thread(Worker *self, double timeout) {
    shared *s = self->s;
    if (!s)
        return 1;
    if (self->pid != getpid()) { /* forked: the thread (and maybe its lock) is not ours */
        self->s = NULL;
        self->started = 0;
        return 0;
    }
    int joined;
    Py_BEGIN_ALLOW_THREADS
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout;
    until.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->wake);
    while (s->running) {
        if (pthread_cond_timedwait(&s->gone, &s->mu, &until) == ETIMEDOUT)
            break;
    }
    joined = !s->running;
    if (!joined)
        s->abandoned = 1; /* the thread frees `s` when its read returns */
    pthread_mutex_unlock(&s->mu);
    if (joined && self->started)
        pthread_join(self->thread, NULL);
    else if (self->started)
        pthread_detach(self->thread);
    Py_END_ALLOW_THREADS
    self->started = 0;
    self->s = NULL;
    if (joined) {
        release_list(s->head);
        release_list(s->done);
        free_shared(s);
    }
    return joined;
}

static void Worker_dealloc(Worker *self) {
    stop_thread(self, 5.0);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Worker_read(Worker *self, PyObject *args) {
    unsigned long long token, offset, size;
    int fd;
    if (!PyArg_ParseTuple(args, "KiKK", &token, &fd, &offset, &size))
        return NULL;
    shared *s = self->pid == getpid() ? self->s : NULL;
    if (!s) {
        PyErr_SetString(PyExc_ValueError, "worker stopped");
        return NULL;
    }
    if (size == 0 || size > (1ULL << 30) || offset > (1ULL << 62)) {
        PyErr_SetString(PyExc_ValueError, "read size or offset out of range");
        return NULL;
    }
    job *j = PyMem_RawCalloc(1, sizeof *j);
    if (!j)
        return PyErr_NoMemory();
    j->rfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (j->rfd < 0) {
        PyMem_RawFree(j);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    j->token = token;
    j->offset = offset;
    j->size = (size_t)size;
    int ok = enqueue(s, j);
    if (!ok)
        release_list(j);
    return PyBool_FromLong(ok);
}

static PyObject *Worker_reap(Worker *self, PyObject *unused) {
    (void)unused;
    shared *s = self->pid == getpid() ? self->s : NULL;
    if (!s)
        return PyList_New(0);
    uint64_t count;
    while (read(s->efd, &count, sizeof count) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&s->mu);
    job *j = s->done;
    s->done = NULL;
    for (job *k = j; k; k = k->next)
        s->queued--; /* a job counts against the limit until reaped (its memory too) */
    pthread_mutex_unlock(&s->mu);
    PyObject *out = PyList_New(0);
    for (job *k = j; k && out; k = k->next) {
        PyObject *block = Py_None;
        Py_INCREF(block);
        if (k->mem && k->result >= 0) {
            Block *b = PyObject_New(Block, &BlockType);
            if (b) {
                b->mem = k->mem;
                b->len = (Py_ssize_t)k->result;
                b->exports = 0;
                k->mem = NULL; /* the Block owns it now */
                Py_SETREF(block, (PyObject *)b);
            } else {
                Py_CLEAR(out);
                Py_CLEAR(block);
                break;
            }
        }
        PyObject *item = Py_BuildValue("(KLN)", k->token, k->result, block);
        if (!item || PyList_Append(out, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
    }
    release_list(j);
    return out;
}

static PyObject *Worker_stop(Worker *self, PyObject *args) {
    double timeout = 5.0;
    if (!PyArg_ParseTuple(args, "|d", &timeout))
        return NULL;
    if (timeout < 0)
        timeout = 0;
    return PyBool_FromLong(stop_thread(self, timeout));
}

static PyObject *Worker_fileno(Worker *self, PyObject *unused) {
    (void)unused;
    if (!self->s) {
        PyErr_SetString(PyExc_ValueError, "worker stopped");
        return NULL;
    }
    return PyLong_FromLong(self->s->efd);
}

static PyMethodDef Worker_methods[] = {
    {"read", (PyCFunction)Worker_read, METH_VARARGS,
     "read(token, fd, offset, size) -> bool: queue a pread of a dup of fd (False: limit "
     "reads queued, running or not reaped yet, or stopped)"},
    {"reap", (PyCFunction)Worker_reap, METH_NOARGS,
     "reap() -> [(token, result, block)]: the reads done since the last reap: the bytes "
     "read and their Block, or -errno and None"},
    {"stop", (PyCFunction)Worker_stop, METH_VARARGS,
     "stop(timeout=5.0) -> bool: end the thread (queued jobs are dropped); False when a "
     "job still ran after timeout seconds and the thread was abandoned"},
    {"fileno", (PyCFunction)Worker_fileno, METH_NOARGS,
     "fileno() -> int: an eventfd readable when jobs are done"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gitxet.util._bgio.Worker",
    .tp_basicsize = sizeof(Worker),
    .tp_dealloc = (destructor)Worker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Worker(limit=64): preads on a thread of its own",
    .tp_methods = Worker_methods,
    .tp_new = Worker_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bgio",
    "preads on a thread that never takes the interpreter lock", -1,
    NULL, NULL, NULL, NULL, NULL,
};

static int add_type(PyObject *m, const char *name, PyTypeObject *type) {
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__bgio(void) {
    if (PyType_Ready(&WorkerType) < 0 || PyType_Ready(&BlockType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (add_type(m, "Worker", &WorkerType) < 0 || add_type(m, "Block", &BlockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
