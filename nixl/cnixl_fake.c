//go:build nixlfake

/*
 * An in-process fake of the cnixl ABI, written for ecxfer's tests: agents
 * live in one process and find each other by name; a READ is a memcpy on a
 * thread of its own after a configurable delay, and delivers its
 * notification to the target agent. Failures can be injected per operation.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cnixl_fake.h"

struct xfer {
	cnixl_handle h;
	int status;   /* guarded by g_mu */
	int canceled; /* guarded by g_mu */
	int refs;     /* the agent's table and the thread */
	char *initiator;
	char *target;
	uintptr_t local_base;
	uint64_t block_size;
	int n;
	int32_t *local;
	int32_t *remote;
	void *notif;
	size_t notiflen;
	/* A touch (cnixl_post_touch): touch_len bytes at touch_addr into local_base. */
	uint64_t touch_addr, touch_len;
};

struct remote {
	char *name;
	size_t ndescs;
	int connected; /* cnixl_make_connection was called for it */
};

struct cnixl_agent {
	char *name;
	uintptr_t base;
	uint64_t block_size, nblocks;
	int registered;
	unsigned char *touch; /* the touch page, CNIXL_TOUCH_LEN bytes */
	struct remote *remotes;
	int nremotes;
	struct xfer **xfers;
	int nxfers, capxfers;
	cnixl_handle next;
	unsigned char *notifs;
	size_t notiflen, notifcap;
	int hold_notifs; /* get_notifs waits while set (tests) */
	int in_notifs;   /* get_notifs calls waiting */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static cnixl_agent *g_agents[256];
static int g_nagents;
static long g_delay_us;
static int g_inline; /* READs complete within the post, as UCX over shared memory's do */
static int g_fail_op, g_fail_status, g_fail_count;
static pthread_cond_t g_notifs_cond = PTHREAD_COND_INITIALIZER;
static int g_hang; /* threaded READs wait, unended, while set (tests) */
static pthread_cond_t g_hang_cond = PTHREAD_COND_INITIALIZER;

static char *dupstr(const char *s) {
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	memcpy(d, s, n);
	return d;
}

/* injected returns the status to fail op with, or 0. Called with g_mu. */
static int injected(int op) {
	if (g_fail_count > 0 && g_fail_op == op) {
		g_fail_count--;
		return g_fail_status;
	}
	return 0;
}

void cnixl_fake_set_delay_us(long us) {
	pthread_mutex_lock(&g_mu);
	g_delay_us = us;
	pthread_mutex_unlock(&g_mu);
}

void cnixl_fake_set_inline(int on) {
	pthread_mutex_lock(&g_mu);
	g_inline = on;
	pthread_mutex_unlock(&g_mu);
}

void cnixl_fake_set_hang(int on) {
	pthread_mutex_lock(&g_mu);
	g_hang = on;
	pthread_cond_broadcast(&g_hang_cond);
	pthread_mutex_unlock(&g_mu);
}

void cnixl_fake_fail(int op, int status, int count) {
	pthread_mutex_lock(&g_mu);
	g_fail_op = op;
	g_fail_status = status;
	g_fail_count = count;
	pthread_mutex_unlock(&g_mu);
}

int cnixl_fake_live_handles(cnixl_agent *a) {
	pthread_mutex_lock(&g_mu);
	int n = a->nxfers;
	pthread_mutex_unlock(&g_mu);
	return n;
}

int cnixl_fake_live_remotes(cnixl_agent *a) {
	pthread_mutex_lock(&g_mu);
	int n = a->nremotes;
	pthread_mutex_unlock(&g_mu);
	return n;
}

static cnixl_agent *find_agent(const char *name) {
	for (int i = 0; i < g_nagents; i++)
		if (strcmp(g_agents[i]->name, name) == 0)
			return g_agents[i];
	return NULL;
}

static char *g_nixl_dir;

void cnixl_fake_set_nixl_dir(const char *dir) {
	pthread_mutex_lock(&g_mu);
	free(g_nixl_dir);
	g_nixl_dir = dir != NULL ? dupstr(dir) : NULL;
	pthread_mutex_unlock(&g_mu);
}

char *cnixl_nixl_dir(void) {
	pthread_mutex_lock(&g_mu);
	char *d = g_nixl_dir != NULL ? dupstr(g_nixl_dir) : NULL;
	pthread_mutex_unlock(&g_mu);
	return d;
}

/* The fake is always there. */
int cnixl_open(const char *path, char **err) {
	(void)path;
	*err = NULL;
	return CNIXL_SUCCESS;
}

int cnixl_agent_new(const char *name, const char *backend, const char *const *keys, const char *const *vals,
                    int nparams, int progress_thread, uint64_t pthr_delay_us, cnixl_agent **out) {
	(void)pthr_delay_us;
	(void)keys;
	(void)vals;
	(void)nparams;
	(void)progress_thread;
	if (strcmp(backend, "UCX") != 0)
		return CNIXL_ERR_NOT_FOUND;
	pthread_mutex_lock(&g_mu);
	int st = injected(CNIXL_FAKE_OP_NEW);
	if (st != 0) {
		pthread_mutex_unlock(&g_mu);
		return st;
	}
	if (find_agent(name) != NULL || g_nagents == (int)(sizeof g_agents / sizeof g_agents[0])) {
		pthread_mutex_unlock(&g_mu);
		return CNIXL_ERR_NOT_ALLOWED;
	}
	cnixl_agent *a = calloc(1, sizeof *a);
	a->name = dupstr(name);
	g_agents[g_nagents++] = a;
	pthread_mutex_unlock(&g_mu);
	*out = a;
	return CNIXL_SUCCESS;
}

static void xfer_unref(struct xfer *x) {
	if (--x->refs > 0)
		return;
	free(x->initiator);
	free(x->target);
	free(x->local);
	free(x->remote);
	free(x->notif);
	free(x);
}

void cnixl_agent_destroy(cnixl_agent *a) {
	pthread_mutex_lock(&g_mu);
	for (int i = 0; i < g_nagents; i++) {
		if (g_agents[i] == a) {
			g_agents[i] = g_agents[--g_nagents];
			break;
		}
	}
	/* Nothing may write into the region once this returns. */
	for (int i = 0; i < a->nxfers; i++) {
		a->xfers[i]->canceled = 1;
		xfer_unref(a->xfers[i]);
	}
	pthread_cond_broadcast(&g_hang_cond); /* hung READs end, canceled */
	for (int i = 0; i < a->nremotes; i++)
		free(a->remotes[i].name);
	pthread_mutex_unlock(&g_mu);
	free(a->remotes);
	free(a->xfers);
	free(a->notifs);
	free(a->name);
	free(a->touch);
	free(a);
}

int cnixl_register(cnixl_agent *a, uintptr_t base, uint64_t block_size, uint64_t nblocks) {
	pthread_mutex_lock(&g_mu);
	a->base = base;
	a->block_size = block_size;
	a->nblocks = nblocks;
	a->registered = 1;
	if (a->touch == NULL)
		a->touch = calloc(1, CNIXL_TOUCH_LEN);
	pthread_mutex_unlock(&g_mu);
	return CNIXL_SUCCESS;
}

void *cnixl_touch_page(cnixl_agent *a) {
	pthread_mutex_lock(&g_mu);
	void *p = a->touch;
	pthread_mutex_unlock(&g_mu);
	return p;
}

/* registered reports whether [addr, addr+len) lies in t's registered
 * memory, its region or its touch page. Called with g_mu. */
static int registered(cnixl_agent *t, uint64_t addr, uint64_t len) {
	uint64_t tp = (uint64_t)(uintptr_t)t->touch;
	if (t->touch != NULL && addr >= tp && len <= CNIXL_TOUCH_LEN && addr - tp <= CNIXL_TOUCH_LEN - len)
		return 1;
	uint64_t size = t->block_size * t->nblocks;
	return t->registered && addr >= t->base && len <= size && addr - t->base <= size - len;
}

int cnixl_local_md(cnixl_agent *a, void **md, size_t *len) {
	static const char prefix[] = "fakenixl:";
	size_t n = strlen(prefix) + strlen(a->name);
	char *b = malloc(n + 1);
	strcpy(b, prefix);
	strcat(b, a->name);
	*md = b;
	*len = n;
	return CNIXL_SUCCESS;
}

static int load_remote(cnixl_agent *a, const void *md, size_t mdlen, size_t ndescs, char **name);

int cnixl_load_remote(cnixl_agent *a, const void *md, size_t mdlen, const uint64_t *descs, size_t ndescs,
                      char **name) {
	(void)descs;
	return load_remote(a, md, mdlen, ndescs, name);
}

int cnixl_load_remote_blocks(cnixl_agent *a, const void *md, size_t mdlen, uint64_t base, uint64_t block_size,
                             uint64_t nblocks, uint64_t dev, char **name) {
	(void)base;
	(void)block_size;
	(void)dev;
	return load_remote(a, md, mdlen, nblocks, name);
}

static int load_remote(cnixl_agent *a, const void *md, size_t mdlen, size_t ndescs, char **name) {
	static const char prefix[] = "fakenixl:";
	size_t pl = strlen(prefix);
	if (mdlen <= pl || memcmp(md, prefix, pl) != 0)
		return CNIXL_ERR_INVALID_PARAM;
	pthread_mutex_lock(&g_mu);
	int st = injected(CNIXL_FAKE_OP_LOAD);
	if (st != 0) {
		pthread_mutex_unlock(&g_mu);
		return st;
	}
	char *n = malloc(mdlen - pl + 1);
	memcpy(n, (const char *)md + pl, mdlen - pl);
	n[mdlen - pl] = 0;
	for (int i = 0; i < a->nremotes; i++) {
		if (strcmp(a->remotes[i].name, n) == 0) {
			pthread_mutex_unlock(&g_mu);
			free(n);
			return CNIXL_ERR_NOT_ALLOWED; /* loaded already */
		}
	}
	a->remotes = realloc(a->remotes, (a->nremotes + 1) * sizeof *a->remotes);
	a->remotes[a->nremotes].name = n;
	a->remotes[a->nremotes].ndescs = ndescs;
	a->remotes[a->nremotes].connected = 0;
	a->nremotes++;
	pthread_mutex_unlock(&g_mu);
	*name = dupstr(n);
	return CNIXL_SUCCESS;
}

int cnixl_make_connection(cnixl_agent *a, const char *name) {
	pthread_mutex_lock(&g_mu);
	for (int i = 0; i < a->nremotes; i++) {
		if (strcmp(a->remotes[i].name, name) == 0) {
			a->remotes[i].connected = 1;
			pthread_mutex_unlock(&g_mu);
			return CNIXL_SUCCESS;
		}
	}
	pthread_mutex_unlock(&g_mu);
	return CNIXL_ERR_NOT_FOUND;
}

int cnixl_gen_notif(cnixl_agent *a, const char *name, const void *msg, size_t len) {
	pthread_mutex_lock(&g_mu);
	int known = 0;
	for (int i = 0; i < a->nremotes; i++)
		if (strcmp(a->remotes[i].name, name) == 0)
			known = 1;
	cnixl_agent *t = known ? find_agent(name) : NULL;
	if (t == NULL) {
		pthread_mutex_unlock(&g_mu);
		return known ? CNIXL_ERR_REMOTE_DISCONNECT : CNIXL_ERR_NOT_FOUND;
	}
	uint32_t nl = strlen(a->name), ml = len;
	size_t need = t->notiflen + 8 + nl + ml;
	if (need > t->notifcap) {
		t->notifcap = need * 2;
		t->notifs = realloc(t->notifs, t->notifcap);
	}
	unsigned char *p = t->notifs + t->notiflen;
	memcpy(p, &nl, 4);
	memcpy(p + 4, a->name, nl);
	memcpy(p + 4 + nl, &ml, 4);
	memcpy(p + 8 + nl, msg, ml);
	t->notiflen = need;
	pthread_mutex_unlock(&g_mu);
	return CNIXL_SUCCESS;
}

int cnixl_fake_connected(cnixl_agent *a, const char *name) {
	int c = 0;
	pthread_mutex_lock(&g_mu);
	for (int i = 0; i < a->nremotes; i++) {
		if (strcmp(a->remotes[i].name, name) == 0) {
			c = a->remotes[i].connected;
		}
	}
	pthread_mutex_unlock(&g_mu);
	return c;
}

int cnixl_remove_remote(cnixl_agent *a, const char *name) {
	pthread_mutex_lock(&g_mu);
	for (int i = 0; i < a->nremotes; i++) {
		if (strcmp(a->remotes[i].name, name) == 0) {
			free(a->remotes[i].name);
			a->remotes[i] = a->remotes[--a->nremotes];
			pthread_mutex_unlock(&g_mu);
			return CNIXL_SUCCESS;
		}
	}
	pthread_mutex_unlock(&g_mu);
	return CNIXL_ERR_NOT_FOUND;
}

int cnixl_md_agent(const void *md, size_t mdlen, char **name) {
	static const char prefix[] = "fakenixl:";
	size_t pl = strlen(prefix);
	if (mdlen <= pl || memcmp(md, prefix, pl) != 0 || memchr((const char *)md + pl, 0, mdlen - pl) != NULL)
		return CNIXL_ERR_INVALID_PARAM;
	char *n = malloc(mdlen - pl + 1);
	memcpy(n, (const char *)md + pl, mdlen - pl);
	n[mdlen - pl] = 0;
	*name = n;
	return CNIXL_SUCCESS;
}

/* A failed load leaves nothing behind here. */
void cnixl_forget_remote(cnixl_agent *a, const char *name) {
	(void)a;
	(void)name;
}

static void do_read(struct xfer *x);

static void *run_read(void *arg) {
	struct xfer *x = arg;
	pthread_mutex_lock(&g_mu);
	long delay = g_delay_us;
	pthread_mutex_unlock(&g_mu);
	if (delay > 0) {
		struct timespec ts = {delay / 1000000, (delay % 1000000) * 1000};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
		}
	}
	pthread_mutex_lock(&g_mu);
	while (g_hang && !x->canceled)
		pthread_cond_wait(&g_hang_cond, &g_mu);
	do_read(x);
	xfer_unref(x);
	pthread_mutex_unlock(&g_mu);
	return NULL;
}

/* do_read moves a READ's bytes and sets its status. Called with g_mu. */
static void do_read(struct xfer *x) {
	if (x->canceled) {
		x->status = CNIXL_ERR_CANCELED;
	} else {
		cnixl_agent *t = find_agent(x->target);
		if (t == NULL || !t->registered) {
			x->status = CNIXL_ERR_REMOTE_DISCONNECT;
		} else if (x->touch_len > 0) {
			if (registered(t, x->touch_addr, x->touch_len)) {
				memcpy((void *)x->local_base, (const void *)(uintptr_t)x->touch_addr, x->touch_len);
				x->status = CNIXL_SUCCESS;
			} else {
				x->status = CNIXL_ERR_NOT_FOUND;
			}
		} else if (t->block_size != x->block_size) {
			x->status = CNIXL_ERR_MISMATCH;
		} else {
			int ok = 1;
			for (int i = 0; i < x->n; i++)
				if (x->remote[i] < 0 || (uint64_t)x->remote[i] >= t->nblocks)
					ok = 0;
			if (!ok) {
				x->status = CNIXL_ERR_INVALID_PARAM;
			} else {
				for (int i = 0; i < x->n; i++)
					memcpy((void *)(x->local_base + (uint64_t)x->local[i] * x->block_size),
					       (const void *)(t->base + (uint64_t)x->remote[i] * t->block_size), x->block_size);
				/* Deliver the notification: u32 name len, name, u32 msg len, msg. */
				uint32_t nl = strlen(x->initiator), ml = x->notiflen;
				size_t need = t->notiflen + 8 + nl + ml;
				if (need > t->notifcap) {
					t->notifcap = need * 2;
					t->notifs = realloc(t->notifs, t->notifcap);
				}
				unsigned char *p = t->notifs + t->notiflen;
				memcpy(p, &nl, 4);
				memcpy(p + 4, x->initiator, nl);
				memcpy(p + 4 + nl, &ml, 4);
				memcpy(p + 8 + nl, x->notif, ml);
				t->notiflen = need;
				x->status = CNIXL_SUCCESS;
			}
		}
	}
}

/* start runs x, which the caller filled in and a's table holds: inline,
 * or on a thread of its own. Called with g_mu, which it releases. */
static int start(cnixl_agent *a, struct xfer *x, cnixl_handle *out) {
	if (a->nxfers == a->capxfers) {
		a->capxfers = a->capxfers ? 2 * a->capxfers : 16;
		a->xfers = realloc(a->xfers, a->capxfers * sizeof *a->xfers);
	}
	a->xfers[a->nxfers++] = x;
	x->refs = g_inline ? 1 : 2; /* the handle's, and the thread's */
	*out = x->h;
	if (g_inline) {
		do_read(x);
		int st = x->status == CNIXL_SUCCESS ? CNIXL_SUCCESS : CNIXL_IN_PROG;
		pthread_mutex_unlock(&g_mu);
		return st;
	}
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &attr, run_read, x) != 0) {
		x->status = CNIXL_ERR_BACKEND;
		x->refs--;
	}
	pthread_attr_destroy(&attr);
	pthread_mutex_unlock(&g_mu);
	return CNIXL_IN_PROG; /* its thread moves the bytes */
}

/* known reports whether a loaded the remote agent name. Called with g_mu. */
static int known(cnixl_agent *a, const char *name) {
	for (int i = 0; i < a->nremotes; i++)
		if (strcmp(a->remotes[i].name, name) == 0)
			return 1;
	return 0;
}

int cnixl_post_read(cnixl_agent *a, const int32_t *local, const int32_t *remote, int n, const char *agent,
                    const void *notif, size_t notiflen, cnixl_handle *out) {
	pthread_mutex_lock(&g_mu);
	int st = injected(CNIXL_FAKE_OP_POST);
	if (st == 0 && !known(a, agent))
		st = CNIXL_ERR_NOT_FOUND;
	for (int i = 0; st == 0 && i < n; i++)
		if (local[i] < 0 || (uint64_t)local[i] >= a->nblocks)
			st = CNIXL_ERR_INVALID_PARAM;
	if (st != 0) {
		pthread_mutex_unlock(&g_mu);
		return st;
	}
	struct xfer *x = calloc(1, sizeof *x);
	x->h = ++a->next;
	x->status = CNIXL_IN_PROG;
	x->initiator = dupstr(a->name);
	x->target = dupstr(agent);
	x->local_base = a->base;
	x->block_size = a->block_size;
	x->n = n;
	x->local = malloc(n * sizeof(int32_t) + 1);
	x->remote = malloc(n * sizeof(int32_t) + 1);
	memcpy(x->local, local, n * sizeof(int32_t));
	memcpy(x->remote, remote, n * sizeof(int32_t));
	x->notif = malloc(notiflen + 1);
	memcpy(x->notif, notif, notiflen);
	x->notiflen = notiflen;
	return start(a, x, out);
}

int cnixl_post_touch(cnixl_agent *a, const char *agent, uint64_t addr, uint64_t len, uint64_t dev,
                     cnixl_handle *out) {
	pthread_mutex_lock(&g_mu);
	int st = injected(CNIXL_FAKE_OP_POST);
	cnixl_agent *t = find_agent(agent);
	if (st == 0 && (a->touch == NULL || len == 0 || len > CNIXL_TOUCH_LEN || addr > UINT64_MAX - len || dev != 0))
		st = CNIXL_ERR_INVALID_PARAM;
	else if (st == 0 && !known(a, agent))
		st = CNIXL_ERR_NOT_FOUND;
	else if (st == 0 && t != NULL && !registered(t, addr, len))
		st = CNIXL_ERR_NOT_FOUND; /* NIXL checks the range against the remote's registrations */
	if (st != 0) {
		pthread_mutex_unlock(&g_mu);
		return st;
	}
	struct xfer *x = calloc(1, sizeof *x);
	x->h = ++a->next;
	x->status = CNIXL_IN_PROG;
	x->initiator = dupstr(a->name);
	x->target = dupstr(agent);
	x->local_base = (uintptr_t)a->touch;
	x->touch_addr = addr;
	x->touch_len = len;
	return start(a, x, out);
}

static int find_xfer(cnixl_agent *a, cnixl_handle h) {
	for (int i = 0; i < a->nxfers; i++)
		if (a->xfers[i]->h == h)
			return i;
	return -1;
}

int cnixl_check(cnixl_agent *a, cnixl_handle h) {
	pthread_mutex_lock(&g_mu);
	int st = injected(CNIXL_FAKE_OP_CHECK);
	if (st == 0) {
		int i = find_xfer(a, h);
		st = i < 0 ? CNIXL_ERR_NOT_FOUND : a->xfers[i]->status;
	}
	pthread_mutex_unlock(&g_mu);
	return st;
}

int cnixl_release(cnixl_agent *a, cnixl_handle h) {
	pthread_mutex_lock(&g_mu);
	int i = find_xfer(a, h);
	if (i < 0) {
		pthread_mutex_unlock(&g_mu);
		return CNIXL_ERR_NOT_FOUND;
	}
	struct xfer *x = a->xfers[i];
	int st = injected(CNIXL_FAKE_OP_RELEASE);
	if (st != 0 && x->status == CNIXL_IN_PROG) {
		/* Could not abort: the READ goes on, the handle stays. */
		pthread_mutex_unlock(&g_mu);
		return st;
	}
	x->canceled = 1; /* the copy happens under g_mu: none will follow */
	pthread_cond_broadcast(&g_hang_cond);
	a->xfers[i] = a->xfers[--a->nxfers];
	xfer_unref(x);
	pthread_mutex_unlock(&g_mu);
	return CNIXL_SUCCESS;
}

void cnixl_fake_hold_notifs(cnixl_agent *a, int on) {
	pthread_mutex_lock(&g_mu);
	a->hold_notifs = on;
	pthread_cond_broadcast(&g_notifs_cond);
	pthread_mutex_unlock(&g_mu);
}

int cnixl_fake_in_notifs(cnixl_agent *a) {
	pthread_mutex_lock(&g_mu);
	int n = a->in_notifs;
	pthread_mutex_unlock(&g_mu);
	return n;
}

int cnixl_get_notifs(cnixl_agent *a, void **buf, size_t *len) {
	pthread_mutex_lock(&g_mu);
	a->in_notifs++;
	while (a->hold_notifs)
		pthread_cond_wait(&g_notifs_cond, &g_mu);
	a->in_notifs--;
	*len = a->notiflen;
	*buf = NULL;
	if (a->notiflen > 0) {
		*buf = malloc(a->notiflen);
		memcpy(*buf, a->notifs, a->notiflen);
		a->notiflen = 0;
	}
	pthread_mutex_unlock(&g_mu);
	return CNIXL_SUCCESS;
}

void cnixl_free(void *p) { free(p); }
