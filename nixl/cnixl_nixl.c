//go:build nixl

/*
 * cnixl over NIXL's own C API (libnixl_capi.so, nixl_capi.h), loaded with
 * dlopen when the first agent is made, so that a binary built with the nixl
 * tag starts, and serves the TCP data plane, where NIXL is not installed.
 * The few declarations of nixl_capi.h used here are repeated below: the
 * build needs no NIXL headers and links no NIXL library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cnixl.h"

/* From nixl_capi.h (NIXL 1.4.0): every handle is a pointer to an opaque
 * struct, every status an int-sized enum. */
typedef void *capi_agent, *capi_params, *capi_backend, *capi_opts, *capi_xlist, *capi_xlist_h, *capi_rlist,
	*capi_req, *capi_notifs;

enum {
	CAPI_SUCCESS = 0,
	CAPI_IN_PROG = 1,
	CAPI_ERR_INVALID_PARAM = -1,
	CAPI_ERR_BACKEND = -2,
	CAPI_ERR_INVALID_STATE = -3,
	CAPI_ERR_EXCEPTION = -4,
	CAPI_ERR_NO_TELEMETRY = -5,
	CAPI_ERR_NOT_FOUND = -6,
};
enum { CAPI_MEM_DRAM = 0 };
enum { CAPI_READ = 0 };

typedef struct {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync; /* nixl_capi_thread_sync_t; 0: NIXL's default */
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} capi_config;

/* The functions used, resolved by dlsym into capi. */
#define CAPI_FUNCS(X)                                                                                      \
	X(create_configured_agent, (const char *, const capi_config *, capi_agent *))                         \
	X(destroy_agent, (capi_agent))                                                                         \
	X(create_params, (capi_params *))                                                                      \
	X(params_add, (capi_params, const char *, const char *))                                               \
	X(destroy_params, (capi_params))                                                                       \
	X(create_backend, (capi_agent, const char *, capi_params, capi_backend *))                             \
	X(destroy_backend, (capi_backend))                                                                     \
	X(create_opt_args, (capi_opts *))                                                                      \
	X(destroy_opt_args, (capi_opts))                                                                       \
	X(opt_args_add_backend, (capi_opts, capi_backend))                                                     \
	X(opt_args_set_notif_msg, (capi_opts, const void *, size_t))                                           \
	X(opt_args_set_has_notif, (capi_opts, bool))                                                           \
	X(create_reg_dlist, (int, capi_rlist *))                                                               \
	X(destroy_reg_dlist, (capi_rlist))                                                                     \
	X(reg_dlist_add_desc, (capi_rlist, uintptr_t, size_t, uint64_t, const void *, size_t))                 \
	X(register_mem, (capi_agent, capi_rlist, capi_opts))                                                   \
	X(deregister_mem, (capi_agent, capi_rlist, capi_opts))                                                 \
	X(create_xfer_dlist, (int, capi_xlist *))                                                              \
	X(destroy_xfer_dlist, (capi_xlist))                                                                    \
	X(xfer_dlist_add_desc, (capi_xlist, uintptr_t, size_t, uint64_t))                                      \
	X(prep_xfer_dlist, (capi_agent, const char *, capi_xlist, capi_xlist_h *, capi_opts))                  \
	X(release_xfer_dlist_handle, (capi_agent, capi_xlist_h))                                               \
	X(get_local_md, (capi_agent, void **, size_t *))                                                       \
	X(load_remote_md, (capi_agent, const void *, size_t, char **))                                         \
	X(invalidate_remote_md, (capi_agent, const char *))                                                    \
	X(agent_make_connection, (capi_agent, const char *, capi_opts))                                        \
	X(gen_notif, (capi_agent, const char *, const void *, size_t, capi_opts))                              \
	X(create_xfer_req, (capi_agent, int, capi_xlist, capi_xlist, const char *, capi_req *, capi_opts))     \
	X(make_xfer_req, (capi_agent, int, capi_xlist_h, const int *, size_t, capi_xlist_h, const int *, size_t, \
	                  capi_req *, capi_opts))                                                              \
	X(post_xfer_req, (capi_agent, capi_req, capi_opts))                                                    \
	X(get_xfer_status, (capi_agent, capi_req))                                                             \
	X(release_xfer_req, (capi_agent, capi_req))                                                            \
	X(destroy_xfer_req, (capi_req))                                                                        \
	X(get_notifs, (capi_agent, capi_notifs, capi_opts))                                                    \
	X(create_notif_map, (capi_notifs *))                                                                   \
	X(destroy_notif_map, (capi_notifs))                                                                    \
	X(notif_map_size, (capi_notifs, size_t *))                                                             \
	X(notif_map_get_agent_at, (capi_notifs, size_t, const char **))                                        \
	X(notif_map_get_notifs_size, (capi_notifs, const char *, size_t *))                                    \
	X(notif_map_get_notif, (capi_notifs, const char *, size_t, const void **, size_t *))

#define CAPI_FIELD(name, args) int(*name) args;
static struct {
	CAPI_FUNCS(CAPI_FIELD)
} capi;

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static int opened;

static char *msgf(const char *fmt, const char *a, const char *b) {
	int n = snprintf(NULL, 0, fmt, a, b);
	char *s = malloc((size_t)n + 1);
	if (s != NULL)
		snprintf(s, (size_t)n + 1, fmt, a, b);
	return s;
}

int cnixl_open(const char *path, char **err) {
	*err = NULL;
	pthread_mutex_lock(&open_mu);
	if (opened) {
		pthread_mutex_unlock(&open_mu);
		return CNIXL_SUCCESS;
	}
	const char *file = path != NULL ? path : CNIXL_LIB;
	void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		*err = msgf("%s%s", e != NULL ? e : file, e != NULL ? "" : ": cannot load");
		pthread_mutex_unlock(&open_mu);
		return CNIXL_ERR_NOT_INSTALLED;
	}
#define CAPI_LOOKUP(name, args)                                                                        \
	*(void **)(&capi.name) = dlsym(h, "nixl_capi_" #name);                                             \
	if (capi.name == NULL) {                                                                           \
		*err = msgf("%s has no nixl_capi_%s: a NIXL older than 1.4.0?", file, #name);                   \
		memset(&capi, 0, sizeof capi);                                                                 \
		dlclose(h);                                                                                    \
		pthread_mutex_unlock(&open_mu);                                                                \
		return CNIXL_ERR_NOT_INSTALLED;                                                                \
	}
	CAPI_FUNCS(CAPI_LOOKUP)
	opened = 1; /* never closed: NIXL's threads and plugins live on in the process */
	pthread_mutex_unlock(&open_mu);
	return CNIXL_SUCCESS;
}

char *cnixl_nixl_dir(void) {
	/* libnixl_capi.so loaded it: this only finds it. */
	void *h = dlopen("libnixl.so", RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL)
		return NULL;
	struct link_map *lm = NULL;
	char *dir = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_name != NULL) {
		const char *slash = strrchr(lm->l_name, '/');
		if (slash != NULL && (dir = malloc((size_t)(slash - lm->l_name) + 1)) != NULL) {
			memcpy(dir, lm->l_name, (size_t)(slash - lm->l_name));
			dir[slash - lm->l_name] = 0;
		}
	}
	dlclose(h);
	return dir;
}

/* status maps a nixl_capi_status_t to cnixl's (nixl_status_t) numbers. The
 * C API folds most of NIXL's errors into its backend error. */
static int status(int st) {
	switch (st) {
	case CAPI_SUCCESS:
		return CNIXL_SUCCESS;
	case CAPI_IN_PROG:
		return CNIXL_IN_PROG;
	case CAPI_ERR_INVALID_PARAM:
		return CNIXL_ERR_INVALID_PARAM;
	case CAPI_ERR_BACKEND:
		return CNIXL_ERR_BACKEND;
	case CAPI_ERR_NOT_FOUND:
		return CNIXL_ERR_NOT_FOUND;
	case CAPI_ERR_NO_TELEMETRY:
		return CNIXL_ERR_NO_TELEMETRY;
	}
	return CNIXL_ERR_UNKNOWN;
}

/* made is the status of a request NIXL was asked to make: its C API
 * reports every failure of createXferReq as a backend error, and NIXL
 * finds no registration covering the descriptors as not found. */
static int made(int st) {
	return st == CNIXL_ERR_BACKEND || st == CNIXL_ERR_NOT_FOUND ? CNIXL_ERR_NOT_MADE : st;
}

/* A remote agent's blocks: a list NIXL prepared, or, for back-to-back
 * blocks of one size, just their shape (a 16,000-block list cost
 * milliseconds to build for nothing). */
struct remote {
	char *name;
	capi_xlist_h prepped; /* list only */
	uint64_t *descs;      /* list only: (addr, len, dev) triples */
	uint64_t n;
	int regular;
	uint64_t base, bsize, dev;
};

/* A posted READ. Handles are slot+1 in the low half, a sequence number in
 * the high half, so that a stale handle names no request. */
struct slot {
	cnixl_handle h; /* 0: free */
	capi_req req;
};

struct cnixl_agent {
	capi_agent agent;
	capi_backend backend;
	capi_opts opts; /* names the backend; never carries a notification */
	capi_rlist reg;
	capi_xlist_h local;
	uintptr_t base;
	uint64_t bsize;
	void *touch;
	struct remote *remotes;
	size_t nremotes;
	struct slot *slots;
	size_t nslots;
	uint32_t seq;
	pthread_mutex_t mu;
};

enum { touch_page = 4096 };

static struct remote *find_remote(cnixl_agent *a, const char *name) {
	for (size_t i = 0; i < a->nremotes; i++)
		if (strcmp(a->remotes[i].name, name) == 0)
			return &a->remotes[i];
	return NULL;
}

static void drop_remote(cnixl_agent *a, struct remote *r) {
	if (r->prepped != NULL)
		capi.release_xfer_dlist_handle(a->agent, r->prepped);
	free(r->name);
	free(r->descs);
	*r = a->remotes[--a->nremotes];
}

static struct slot *find_slot(cnixl_agent *a, cnixl_handle h) {
	uint64_t i = (h & 0xffffffffu) - 1;
	if (h == 0 || i >= a->nslots || a->slots[i].h != h)
		return NULL;
	return &a->slots[i];
}

/* new_opts makes opt args naming the agent's backend. */
static int new_opts(cnixl_agent *a, capi_opts *o) {
	int st = capi.create_opt_args(o);
	if (st != CAPI_SUCCESS)
		return status(st);
	st = capi.opt_args_add_backend(*o, a->backend);
	if (st != CAPI_SUCCESS) {
		capi.destroy_opt_args(*o);
		return status(st);
	}
	return CNIXL_SUCCESS;
}

int cnixl_agent_new(const char *name, const char *backend, const char *const *keys, const char *const *vals,
                    int nparams, int progress_thread, uint64_t pthr_delay_us, cnixl_agent **out) {
	cnixl_agent *a = calloc(1, sizeof *a);
	if (a == NULL)
		return CNIXL_ERR_UNKNOWN;
	pthread_mutex_init(&a->mu, NULL);
	capi_config cfg = {.enable_prog_thread = progress_thread != 0,
	                   .num_workers = 1,
	                   .pthr_delay_us = pthr_delay_us,
	                   .lthr_delay_us = 100000};
	int st = capi.create_configured_agent(name, &cfg, &a->agent);
	if (st != CAPI_SUCCESS) {
		free(a);
		return status(st);
	}
	capi_params params = NULL;
	st = capi.create_params(&params);
	for (int i = 0; st == CAPI_SUCCESS && i < nparams; i++)
		st = capi.params_add(params, keys[i], vals[i]);
	if (st == CAPI_SUCCESS)
		st = capi.create_backend(a->agent, backend, params, &a->backend);
	if (params != NULL)
		capi.destroy_params(params);
	int cst = st == CAPI_SUCCESS ? new_opts(a, &a->opts) : status(st);
	if (cst != CNIXL_SUCCESS) {
		if (a->backend != NULL)
			capi.destroy_backend(a->backend);
		capi.destroy_agent(a->agent);
		free(a);
		return cst;
	}
	*out = a;
	return CNIXL_SUCCESS;
}

void cnixl_agent_destroy(cnixl_agent *a) {
	pthread_mutex_lock(&a->mu);
	/* A request NIXL cannot release may still be moving bytes: then the
	 * memory stays registered and destroying the agent, which destroys
	 * the UCX workers, is what stops it. */
	int quiet = 1;
	for (size_t i = 0; i < a->nslots; i++) {
		if (a->slots[i].h == 0)
			continue;
		if (capi.release_xfer_req(a->agent, a->slots[i].req) == CAPI_SUCCESS)
			capi.destroy_xfer_req(a->slots[i].req);
		else
			quiet = 0;
	}
	while (a->nremotes > 0) {
		char *name = strdup(a->remotes[0].name);
		drop_remote(a, &a->remotes[0]);
		if (name != NULL)
			capi.invalidate_remote_md(a->agent, name);
		free(name);
	}
	if (a->local != NULL)
		capi.release_xfer_dlist_handle(a->agent, a->local);
	if (a->reg != NULL) {
		if (quiet)
			capi.deregister_mem(a->agent, a->reg, a->opts);
		capi.destroy_reg_dlist(a->reg);
	}
	capi.destroy_agent(a->agent);
	capi.destroy_opt_args(a->opts);
	capi.destroy_backend(a->backend);
	pthread_mutex_unlock(&a->mu);
	pthread_mutex_destroy(&a->mu);
	/* A READ still writing into the touch page stopped with the agent. */
	free(a->touch);
	free(a->slots);
	free(a->remotes);
	free(a);
}

int cnixl_register(cnixl_agent *a, uintptr_t base, uint64_t block_size, uint64_t nblocks) {
	pthread_mutex_lock(&a->mu);
	int st = CNIXL_ERR_UNKNOWN;
	capi_rlist reg = NULL;
	capi_xlist blocks = NULL;
	/* A page of its own: registered memory is mapped by pages. */
	void *touch = aligned_alloc(touch_page, touch_page);
	if (touch == NULL)
		goto out;
	memset(touch, 0, touch_page);
	if ((st = status(capi.create_reg_dlist(CAPI_MEM_DRAM, &reg))) != CNIXL_SUCCESS ||
	    (st = status(capi.reg_dlist_add_desc(reg, base, block_size * nblocks, 0, NULL, 0))) != CNIXL_SUCCESS ||
	    (st = status(capi.reg_dlist_add_desc(reg, (uintptr_t)touch, touch_page, 0, NULL, 0))) != CNIXL_SUCCESS ||
	    (st = status(capi.register_mem(a->agent, reg, a->opts))) != CNIXL_SUCCESS)
		goto out;
	a->reg = reg;
	reg = NULL;
	a->touch = touch;
	touch = NULL;
	a->base = base;
	a->bsize = block_size;
	/* One descriptor per block: block i is descriptor i. */
	if ((st = status(capi.create_xfer_dlist(CAPI_MEM_DRAM, &blocks))) != CNIXL_SUCCESS)
		goto out;
	for (uint64_t i = 0; i < nblocks && st == CNIXL_SUCCESS; i++)
		st = status(capi.xfer_dlist_add_desc(blocks, base + i * block_size, block_size, 0));
	if (st == CNIXL_SUCCESS)
		st = status(capi.prep_xfer_dlist(a->agent, "", blocks, &a->local, a->opts));
out:
	if (blocks != NULL)
		capi.destroy_xfer_dlist(blocks);
	if (reg != NULL)
		capi.destroy_reg_dlist(reg);
	free(touch);
	pthread_mutex_unlock(&a->mu);
	return st;
}

void *cnixl_touch_page(cnixl_agent *a) {
	pthread_mutex_lock(&a->mu);
	void *t = a->touch;
	pthread_mutex_unlock(&a->mu);
	return t;
}

int cnixl_local_md(cnixl_agent *a, void **md, size_t *len) {
	/* NIXL's buffer is malloc'd: cnixl_free frees it. */
	return status(capi.get_local_md(a->agent, md, len));
}

/* load_remote loads a remote agent and keeps rb as its blocks, preparing
 * its list with NIXL when there is one; rb's buffers pass to the agent. */
static int load_remote(cnixl_agent *a, const void *md, size_t mdlen, struct remote rb, char **name) {
	pthread_mutex_lock(&a->mu);
	char *agent = NULL;
	capi_xlist blocks = NULL;
	int st = status(capi.load_remote_md(a->agent, md, mdlen, &agent));
	if (st != CNIXL_SUCCESS)
		goto fail;
	if (!rb.regular) {
		if ((st = status(capi.create_xfer_dlist(CAPI_MEM_DRAM, &blocks))) != CNIXL_SUCCESS)
			goto invalidate;
		for (uint64_t i = 0; i < rb.n && st == CNIXL_SUCCESS; i++)
			st = status(capi.xfer_dlist_add_desc(blocks, rb.descs[3 * i], rb.descs[3 * i + 1], rb.descs[3 * i + 2]));
		if (st == CNIXL_SUCCESS)
			st = status(capi.prep_xfer_dlist(a->agent, agent, blocks, &rb.prepped, a->opts));
		capi.destroy_xfer_dlist(blocks);
		if (st != CNIXL_SUCCESS)
			goto invalidate;
	}
	struct remote *old = find_remote(a, agent);
	if (old != NULL)
		drop_remote(a, old);
	struct remote *grown = realloc(a->remotes, (a->nremotes + 1) * sizeof *grown);
	char *kept = strdup(agent);
	if (grown == NULL || kept == NULL) {
		if (grown != NULL)
			a->remotes = grown;
		free(kept);
		st = CNIXL_ERR_UNKNOWN;
		if (rb.prepped != NULL)
			capi.release_xfer_dlist_handle(a->agent, rb.prepped);
		goto invalidate;
	}
	a->remotes = grown;
	rb.name = kept;
	a->remotes[a->nremotes++] = rb;
	pthread_mutex_unlock(&a->mu);
	*name = agent; /* strdup'd by NIXL: cnixl_free frees it */
	return CNIXL_SUCCESS;
invalidate:
	if (find_remote(a, agent) == NULL) /* else a registration holds it still */
		capi.invalidate_remote_md(a->agent, agent);
fail:
	free(agent);
	free(rb.descs);
	pthread_mutex_unlock(&a->mu);
	return st;
}

int cnixl_load_remote(cnixl_agent *a, const void *md, size_t mdlen, const uint64_t *descs, size_t ndescs,
                      char **name) {
	struct remote rb = {.n = ndescs};
	rb.descs = malloc((ndescs > 0 ? ndescs : 1) * 3 * sizeof(uint64_t));
	if (rb.descs == NULL)
		return CNIXL_ERR_UNKNOWN;
	memcpy(rb.descs, descs, ndescs * 3 * sizeof(uint64_t));
	return load_remote(a, md, mdlen, rb, name);
}

int cnixl_load_remote_blocks(cnixl_agent *a, const void *md, size_t mdlen, uint64_t base, uint64_t block_size,
                             uint64_t nblocks, uint64_t dev, char **name) {
	struct remote rb = {.regular = 1, .base = base, .bsize = block_size, .n = nblocks, .dev = dev};
	return load_remote(a, md, mdlen, rb, name);
}

int cnixl_remove_remote(cnixl_agent *a, const char *name) {
	pthread_mutex_lock(&a->mu);
	struct remote *r = find_remote(a, name);
	if (r == NULL) {
		pthread_mutex_unlock(&a->mu);
		return CNIXL_ERR_NOT_FOUND;
	}
	drop_remote(a, r);
	int st = status(capi.invalidate_remote_md(a->agent, name));
	pthread_mutex_unlock(&a->mu);
	return st;
}

int cnixl_md_agent(const void *md, size_t mdlen, char **name) {
	/* NIXL's serialization: an intro, then the tag "Agent", an 8-byte
	 * length in host order, the name, and a '|' (nixlSerDes::getStr). */
	static const char head[] = "nixlSerDes|Agent";
	const size_t hl = sizeof head - 1;
	const unsigned char *p = md;
	uint64_t n;
	if (mdlen < hl + 8 + 1 || memcmp(p, head, hl) != 0)
		return CNIXL_ERR_INVALID_PARAM;
	memcpy(&n, p + hl, 8);
	if (n == 0 || n > mdlen - hl - 8 - 1 || memchr(p + hl + 8, 0, n) != NULL)
		return CNIXL_ERR_INVALID_PARAM;
	char *s = malloc(n + 1);
	if (s == NULL)
		return CNIXL_ERR_UNKNOWN;
	memcpy(s, p + hl + 8, n);
	s[n] = 0;
	*name = s;
	return CNIXL_SUCCESS;
}

void cnixl_forget_remote(cnixl_agent *a, const char *name) {
	pthread_mutex_lock(&a->mu);
	if (find_remote(a, name) == NULL)
		capi.invalidate_remote_md(a->agent, name);
	pthread_mutex_unlock(&a->mu);
}

static int known(cnixl_agent *a, const char *name) {
	pthread_mutex_lock(&a->mu);
	int ok = find_remote(a, name) != NULL;
	pthread_mutex_unlock(&a->mu);
	return ok;
}

int cnixl_make_connection(cnixl_agent *a, const char *name) {
	if (!known(a, name))
		return CNIXL_ERR_NOT_FOUND;
	return status(capi.agent_make_connection(a->agent, name, a->opts));
}

int cnixl_gen_notif(cnixl_agent *a, const char *name, const void *msg, size_t len) {
	if (!known(a, name))
		return CNIXL_ERR_NOT_FOUND;
	return status(capi.gen_notif(a->agent, name, msg, len, a->opts));
}

/* post posts req, which the agent then holds under a new handle in *out;
 * one NIXL refused is released. The caller holds a->mu. */
static int post(cnixl_agent *a, capi_req req, cnixl_handle *out) {
	size_t i = 0;
	while (i < a->nslots && a->slots[i].h != 0)
		i++;
	if (i == a->nslots) {
		size_t n = a->nslots > 0 ? 2 * a->nslots : 16;
		struct slot *grown = n <= 0xffffffffu ? realloc(a->slots, n * sizeof *grown) : NULL;
		if (grown == NULL) {
			if (capi.release_xfer_req(a->agent, req) == CAPI_SUCCESS)
				capi.destroy_xfer_req(req);
			return CNIXL_ERR_UNKNOWN;
		}
		memset(grown + a->nslots, 0, (n - a->nslots) * sizeof *grown);
		a->slots = grown;
		a->nslots = n;
	}
	int st = status(capi.post_xfer_req(a->agent, req, NULL));
	if (st < 0) {
		if (capi.release_xfer_req(a->agent, req) == CAPI_SUCCESS)
			capi.destroy_xfer_req(req);
		return st;
	}
	if (++a->seq == 0)
		a->seq = 1;
	a->slots[i].h = ((cnixl_handle)a->seq << 32) | (cnixl_handle)(i + 1);
	a->slots[i].req = req;
	*out = a->slots[i].h;
	return st == CNIXL_SUCCESS ? CNIXL_SUCCESS : CNIXL_IN_PROG;
}

/* desc_at is remote block i's (addr, len, dev). */
static void desc_at(const struct remote *r, uint64_t i, uint64_t d[3]) {
	if (r->regular) {
		d[0] = r->base + i * r->bsize;
		d[1] = r->bsize;
		d[2] = r->dev;
	} else {
		memcpy(d, &r->descs[3 * i], 3 * sizeof(uint64_t));
	}
}

int cnixl_post_read(cnixl_agent *a, const int32_t *local, const int32_t *remote, int n, const char *agent,
                    const void *notif, size_t notiflen, cnixl_handle *out) {
	pthread_mutex_lock(&a->mu);
	int st;
	capi_opts o = NULL;
	capi_xlist ld = NULL, rd = NULL;
	capi_req req = NULL;
	int *li = NULL, *ri = NULL;
	struct remote *r = find_remote(a, agent);
	if (r == NULL) {
		st = CNIXL_ERR_NOT_FOUND;
		goto out;
	}
	for (int i = 0; i < n; i++)
		if (remote[i] < 0 || (uint64_t)remote[i] >= r->n) {
			st = CNIXL_ERR_INVALID_PARAM;
			goto out;
		}
	if ((st = new_opts(a, &o)) != CNIXL_SUCCESS)
		goto out;
	if (notiflen > 0 && ((st = status(capi.opt_args_set_notif_msg(o, notif, notiflen))) != CNIXL_SUCCESS ||
	                     (st = status(capi.opt_args_set_has_notif(o, true))) != CNIXL_SUCCESS))
		goto out;
	/* Blocks contiguous on both sides are one descriptor: an entry's
	 * blocks usually are, and each descriptor is one operation for the
	 * backend (UCX over TCP pays per operation). Without a run to merge,
	 * the prepared lists serve, when there are. */
	int merged = 0;
	if ((st = status(capi.create_xfer_dlist(CAPI_MEM_DRAM, &ld))) != CNIXL_SUCCESS ||
	    (st = status(capi.create_xfer_dlist(CAPI_MEM_DRAM, &rd))) != CNIXL_SUCCESS)
		goto out;
	for (int i = 0; i < n && st == CNIXL_SUCCESS;) {
		uint64_t first[3], last[3], next[3];
		desc_at(r, (uint64_t)remote[i], first);
		memcpy(last, first, sizeof last);
		int k = 1;
		while (i + k < n && local[i + k] == local[i] + k && remote[i + k] == remote[i] + k) {
			desc_at(r, (uint64_t)remote[i + k], next);
			if (next[0] != last[0] + last[1] || next[2] != first[2])
				break;
			memcpy(last, next, sizeof last);
			k++;
		}
		if (k > 1)
			merged = 1;
		st = status(capi.xfer_dlist_add_desc(ld, a->base + (uint64_t)local[i] * a->bsize, (uint64_t)k * a->bsize, 0));
		if (st == CNIXL_SUCCESS)
			st = status(capi.xfer_dlist_add_desc(rd, first[0], last[0] + last[1] - first[0], first[2]));
		i += k;
	}
	if (st != CNIXL_SUCCESS)
		goto out;
	if (merged || r->prepped == NULL) {
		st = status(capi.create_xfer_req(a->agent, CAPI_READ, ld, rd, agent, &req, o));
	} else {
		li = malloc((size_t)n * sizeof *li);
		ri = malloc((size_t)n * sizeof *ri);
		if (li == NULL || ri == NULL) {
			st = CNIXL_ERR_UNKNOWN;
			goto out;
		}
		for (int i = 0; i < n; i++) {
			li[i] = local[i];
			ri[i] = remote[i];
		}
		st = status(capi.make_xfer_req(a->agent, CAPI_READ, a->local, li, (size_t)n, r->prepped, ri, (size_t)n,
		                               &req, o));
	}
	st = made(st);
	if (st == CNIXL_SUCCESS)
		st = post(a, req, out);
out:
	free(li);
	free(ri);
	if (ld != NULL)
		capi.destroy_xfer_dlist(ld);
	if (rd != NULL)
		capi.destroy_xfer_dlist(rd);
	if (o != NULL)
		capi.destroy_opt_args(o);
	pthread_mutex_unlock(&a->mu);
	return st;
}

int cnixl_post_touch(cnixl_agent *a, const char *agent, uint64_t addr, uint64_t len, uint64_t dev,
                     cnixl_handle *out) {
	pthread_mutex_lock(&a->mu);
	int st;
	capi_xlist ld = NULL, rd = NULL;
	capi_req req = NULL;
	/* NIXL's range check wraps at the end of the address space. */
	if (a->touch == NULL || len == 0 || len > CNIXL_TOUCH_LEN || addr > UINT64_MAX - len) {
		st = CNIXL_ERR_INVALID_PARAM;
		goto out;
	}
	if (find_remote(a, agent) == NULL) {
		st = CNIXL_ERR_NOT_FOUND;
		goto out;
	}
	/* NIXL refuses a remote range outside the agent's registered memory. */
	if ((st = status(capi.create_xfer_dlist(CAPI_MEM_DRAM, &ld))) != CNIXL_SUCCESS ||
	    (st = status(capi.create_xfer_dlist(CAPI_MEM_DRAM, &rd))) != CNIXL_SUCCESS ||
	    (st = status(capi.xfer_dlist_add_desc(ld, (uintptr_t)a->touch, len, 0))) != CNIXL_SUCCESS ||
	    (st = status(capi.xfer_dlist_add_desc(rd, addr, len, dev))) != CNIXL_SUCCESS ||
	    (st = made(status(capi.create_xfer_req(a->agent, CAPI_READ, ld, rd, agent, &req, a->opts)))) != CNIXL_SUCCESS)
		goto out;
	st = post(a, req, out);
out:
	if (ld != NULL)
		capi.destroy_xfer_dlist(ld);
	if (rd != NULL)
		capi.destroy_xfer_dlist(rd);
	pthread_mutex_unlock(&a->mu);
	return st;
}

int cnixl_check(cnixl_agent *a, cnixl_handle h) {
	pthread_mutex_lock(&a->mu);
	struct slot *s = find_slot(a, h);
	int st = s == NULL ? CNIXL_ERR_NOT_FOUND : status(capi.get_xfer_status(a->agent, s->req));
	pthread_mutex_unlock(&a->mu);
	return st;
}

int cnixl_release(cnixl_agent *a, cnixl_handle h) {
	pthread_mutex_lock(&a->mu);
	struct slot *s = find_slot(a, h);
	int st = CNIXL_ERR_NOT_FOUND;
	if (s != NULL) {
		st = status(capi.release_xfer_req(a->agent, s->req));
		if (st == CNIXL_SUCCESS) {
			capi.destroy_xfer_req(s->req);
			s->h = 0;
			s->req = NULL;
		}
	}
	pthread_mutex_unlock(&a->mu);
	return st;
}

int cnixl_get_notifs(cnixl_agent *a, void **buf, size_t *len) {
	*buf = NULL;
	*len = 0;
	capi_notifs m = NULL;
	int st = status(capi.create_notif_map(&m));
	if (st != CNIXL_SUCCESS)
		return st;
	if ((st = status(capi.get_notifs(a->agent, m, NULL))) != CNIXL_SUCCESS)
		goto out;
	size_t nagents = 0, total = 0;
	if ((st = status(capi.notif_map_size(m, &nagents))) != CNIXL_SUCCESS)
		goto out;
	/* Twice over the map: sizes, then the records. */
	for (int pass = 0; pass < 2; pass++) {
		unsigned char *p = *buf;
		for (size_t i = 0; i < nagents; i++) {
			const char *name;
			size_t nmsgs = 0;
			if ((st = status(capi.notif_map_get_agent_at(m, i, &name))) != CNIXL_SUCCESS ||
			    (st = status(capi.notif_map_get_notifs_size(m, name, &nmsgs))) != CNIXL_SUCCESS)
				goto out;
			uint32_t nl = (uint32_t)strlen(name);
			for (size_t j = 0; j < nmsgs; j++) {
				const void *msg;
				size_t ml = 0;
				if ((st = status(capi.notif_map_get_notif(m, name, j, &msg, &ml))) != CNIXL_SUCCESS)
					goto out;
				if (ml > CNIXL_MAX_NOTIF || nl > CNIXL_MAX_NOTIF)
					continue; /* a peer's: bounded, and framed in 32 bits */
				if (pass == 0) {
					total += 8 + nl + ml;
					continue;
				}
				uint32_t ml32 = (uint32_t)ml;
				memcpy(p, &nl, 4);
				memcpy(p + 4, name, nl);
				memcpy(p + 4 + nl, &ml32, 4);
				memcpy(p + 8 + nl, msg, ml);
				p += 8 + nl + ml;
			}
		}
		if (pass == 0) {
			if (total == 0)
				break;
			if ((*buf = malloc(total)) == NULL) {
				st = CNIXL_ERR_UNKNOWN;
				goto out;
			}
		}
	}
	*len = total;
out:
	if (st != CNIXL_SUCCESS) {
		free(*buf);
		*buf = NULL;
		*len = 0;
	}
	capi.destroy_notif_map(m);
	return st;
}

void cnixl_free(void *p) { free(p); }
