/*
 * cnixl: ecxfer's own thin C ABI between Go and NIXL. Built over NIXL's C
 * API, loaded at run time, with the `nixl` tag (cnixl_nixl.c), or over an
 * in-process fake with the `nixlfake` tag (cnixl_fake.c). Status values are
 * NIXL's nixl_status_t numbers: 1 in progress, 0 success, negative errors.
 *
 * Memory: every buffer a cnixl function returns through an out pointer is
 * malloc'd and freed by the caller with cnixl_free. No function keeps a
 * pointer it was passed after returning, except the region registered by
 * cnixl_register, which must stay mapped until cnixl_agent_destroy.
 */
#ifndef ECXFER_CNIXL_H
#define ECXFER_CNIXL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CNIXL_IN_PROG 1
#define CNIXL_SUCCESS 0
#define CNIXL_ERR_NOT_POSTED -1
#define CNIXL_ERR_INVALID_PARAM -2
#define CNIXL_ERR_BACKEND -3
#define CNIXL_ERR_NOT_FOUND -4
#define CNIXL_ERR_MISMATCH -5
#define CNIXL_ERR_NOT_ALLOWED -6
#define CNIXL_ERR_REPOST_ACTIVE -7
#define CNIXL_ERR_UNKNOWN -8
#define CNIXL_ERR_NOT_SUPPORTED -9
#define CNIXL_ERR_REMOTE_DISCONNECT -10
#define CNIXL_ERR_CANCELED -11
#define CNIXL_ERR_NO_TELEMETRY -12
/* Not a NIXL status: NIXL's library could not be loaded. */
#define CNIXL_ERR_NOT_INSTALLED -1000

/* Not a NIXL status: NIXL could not make a READ's request (its C API
 * says no more); over DRAM, memory outside the agents' registrations. */
#define CNIXL_ERR_NOT_MADE -1001

/* NIXL's C API, the library cnixl_open loads by default. */
#define CNIXL_LIB "libnixl_capi.so"

typedef struct cnixl_agent cnixl_agent;
typedef uint64_t cnixl_handle;

/* Loads NIXL: the file path, or, when path is NULL, CNIXL_LIB wherever the
 * dynamic loader finds it (LD_LIBRARY_PATH, the binary's rpath, ld.so's
 * cache). CNIXL_ERR_NOT_INSTALLED, with *err a message to cnixl_free
 * (dlerror's), when it cannot; once it could, it returns at once. Every
 * other function may be called only after it succeeded. */
int cnixl_open(const char *path, char **err);

/* The folder of the libnixl.so loaded, malloc'd (cnixl_free), or NULL if
 * unknown: NIXL looks for backend plugins in its plugins/ unless
 * NIXL_PLUGIN_DIR is set. */
char *cnixl_nixl_dir(void);

/* Creates an agent with one backend (e.g. "UCX") and its parameters.
 * progress_thread starts NIXL's progress thread, which waits for events at
 * most pthr_delay_us between rounds (0: it spins). */
int cnixl_agent_new(const char *name, const char *backend, const char *const *keys, const char *const *vals,
                    int nparams, int progress_thread, uint64_t pthr_delay_us, cnixl_agent **out);
/* Releases every request, remote agent and registration, then frees the
 * agent. Callers wait for READs to end first (cnixl_check): destroying the
 * agent stops the rest, and nothing writes into the region after it. */
void cnixl_agent_destroy(cnixl_agent *a);

/* Registers the region [base, base+nblocks*block_size) as DRAM and prepares
 * the local descriptor list, one descriptor per block. It also registers
 * the agent's touch page, CNIXL_TOUCH_LEN bytes of its own, zero, apart
 * from the region: a peer's READ of it (cnixl_post_touch) reads nothing
 * of the region. */
int cnixl_register(cnixl_agent *a, uintptr_t base, uint64_t block_size, uint64_t nblocks);

#define CNIXL_TOUCH_LEN 64

/* The touch page (on device 0); NULL before cnixl_register. */
void *cnixl_touch_page(cnixl_agent *a);

/* Posts a READ, with no notification, of len bytes (1 to CNIXL_TOUCH_LEN)
 * at addr on device dev of a loaded remote agent's registered memory into
 * this agent's touch page: a remote's touch page, read ahead of the first
 * READ of its blocks, makes the backend do there the set-up it otherwise
 * does in that READ (over UCX, its choice of protocol). Statuses and *out
 * as cnixl_post_read's. */
int cnixl_post_touch(cnixl_agent *a, const char *agent, uint64_t addr, uint64_t len, uint64_t dev,
                     cnixl_handle *out);

/* This agent's metadata blob. */
int cnixl_local_md(cnixl_agent *a, void **md, size_t *len);

/* Loads a remote agent from its metadata and prepares its descriptor list
 * from ndescs (addr, len, dev) triples; returns its name. */
int cnixl_load_remote(cnixl_agent *a, const void *md, size_t mdlen, const uint64_t *descs, size_t ndescs,
                      char **name);
/* The same for a remote whose blocks are nblocks blocks of block_size
 * bytes each, back to back from base, on device dev: no list is built. */
int cnixl_load_remote_blocks(cnixl_agent *a, const void *md, size_t mdlen, uint64_t base, uint64_t block_size,
                             uint64_t nblocks, uint64_t dev, char **name);
/* The longest notification, and agent name, cnixl_get_notifs hands on: a
 * peer's longer ones are dropped (a real one is "<session>:<mm_hash>..."). */
#define CNIXL_MAX_NOTIF 4096

/* Forgets a remote agent. */
int cnixl_remove_remote(cnixl_agent *a, const char *name);
/* The agent name a load of md would register, in *name (cnixl_free frees
 * it); CNIXL_ERR_INVALID_PARAM when md names none, or one with a NUL. */
int cnixl_md_agent(const void *md, size_t mdlen, char **name);
/* Drops what a failed load left under name, unless name is loaded: NIXL
 * keeps a peer's connection info when the rest of its metadata fails. */
void cnixl_forget_remote(cnixl_agent *a, const char *name);
/* Connects to a loaded remote agent now (NIXL's makeConnection), instead of
 * at the first READ towards it. */
int cnixl_make_connection(cnixl_agent *a, const char *name);
/* Sends a notification, bound to no transfer, to a loaded remote agent
 * (NIXL's genNotif). */
int cnixl_gen_notif(cnixl_agent *a, const char *name, const void *msg, size_t len);

/* Posts a READ of remote blocks into local blocks (n each) carrying notif:
 * CNIXL_SUCCESS when it completed within the post (UCX over shared memory
 * copies there), CNIXL_IN_PROG when it runs on, else an error; *out is set
 * but on error. */
int cnixl_post_read(cnixl_agent *a, const int32_t *local, const int32_t *remote, int n, const char *agent,
                    const void *notif, size_t notiflen, cnixl_handle *out);
/* A posted READ's status. */
int cnixl_check(cnixl_agent *a, cnixl_handle h);
/* Releases a READ; one in progress is aborted if NIXL can, else the
 * request stays and an error is returned. */
int cnixl_release(cnixl_agent *a, cnixl_handle h);

/* Notifications received since the last call, as a buffer of records:
 * u32 name length, name, u32 message length, message (host byte order). */
int cnixl_get_notifs(cnixl_agent *a, void **buf, size_t *len);

void cnixl_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
