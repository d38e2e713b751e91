//go:build nixl

// cnixl over NIXL's C++ agent API (nixl.h). Written against NIXL's public
// headers; compiled only with the nixl build tag, against an installed NIXL.
// No C++ exception crosses into Go: every entry point catches them.

#include "cnixl.h"

#if __has_include(<nixl.h>)

#include <nixl.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

// A remote agent's blocks: a list (and the list NIXL prepared from it), or,
// for a region of back-to-back blocks of one size, just its shape: a
// 16,000-block list cost milliseconds to build (fresh pages) for nothing.
struct remote_blocks {
    nixlDlistH *prepped = nullptr; // list only
    std::vector<nixlBasicDesc> list;
    bool regular = false;
    uint64_t base = 0, bsize = 0, n = 0;
    uint64_t dev = 0;

    size_t count() const { return regular ? n : list.size(); }
    nixlBasicDesc at(size_t i) const { return regular ? nixlBasicDesc(base + i * bsize, bsize, dev) : list[i]; }
};

struct cnixl_agent {
    std::unique_ptr<nixlAgent> agent;
    nixlBackendH *backend = nullptr;
    nixl_reg_dlist_t reg{DRAM_SEG};
    bool registered = false;
    nixlDlistH *local = nullptr;
    uintptr_t base = 0;   // of the local region
    uint64_t bsize = 0;   // its block size
    void *touch = nullptr; // the touch page, registered with the region
    std::map<std::string, remote_blocks> remotes;
    std::map<cnixl_handle, nixlXferReqH *> reqs;
    cnixl_handle next = 0;
    std::mutex mu;

    nixl_opt_args_t opts() const {
        nixl_opt_args_t o;
        o.backends.push_back(backend);
        return o;
    }
};

static constexpr size_t touch_page = 4096;

template <class F> static int guarded(F f) {
    try {
        return f();
    } catch (...) {
        return CNIXL_ERR_UNKNOWN;
    }
}

static void *copy_out(const std::string &s) {
    void *p = std::malloc(s.size() + 1);
    if (p != nullptr) {
        std::memcpy(p, s.data(), s.size());
        static_cast<char *>(p)[s.size()] = 0;
    }
    return p;
}

extern "C" int cnixl_agent_new(const char *name, const char *backend, const char *const *keys,
                               const char *const *vals, int nparams, int progress_thread, uint64_t pthr_delay_us,
                               cnixl_agent **out) {
    return guarded([&] {
        auto a = std::make_unique<cnixl_agent>();
        nixlAgentConfig cfg(progress_thread != 0, false, 0, nixl_thread_sync_t::NIXL_THREAD_SYNC_DEFAULT, 1,
                            pthr_delay_us);
        a->agent = std::make_unique<nixlAgent>(name, cfg);
        nixl_b_params_t params;
        for (int i = 0; i < nparams; i++)
            params[keys[i]] = vals[i];
        nixl_status_t st = a->agent->createBackend(backend, params, a->backend);
        if (st != NIXL_SUCCESS)
            return static_cast<int>(st);
        *out = a.release();
        return CNIXL_SUCCESS;
    });
}

extern "C" void cnixl_agent_destroy(cnixl_agent *a) {
    guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        // A request NIXL cannot release may still be moving bytes: then
        // the memory stays registered and the agent's destructor, which
        // destroys the UCX workers, is what stops it.
        bool quiet = true;
        for (auto &r : a->reqs)
            if (a->agent->releaseXferReq(r.second) != NIXL_SUCCESS)
                quiet = false;
        a->reqs.clear();
        for (auto &r : a->remotes) {
            if (r.second.prepped != nullptr)
                a->agent->releasedDlistH(r.second.prepped);
            a->agent->invalidateRemoteMD(r.first);
        }
        a->remotes.clear();
        if (a->local != nullptr)
            a->agent->releasedDlistH(a->local);
        if (a->registered && quiet) {
            nixl_opt_args_t o = a->opts();
            a->agent->deregisterMem(a->reg, &o);
        }
        return 0;
    });
    // A READ still writing into the touch page stops with the agent.
    void *touch = a->touch;
    delete a;
    std::free(touch);
}

extern "C" int cnixl_register(cnixl_agent *a, uintptr_t base, uint64_t block_size, uint64_t nblocks) {
    return guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        nixl_opt_args_t o = a->opts();
        // A page of its own: registered memory is mapped by pages.
        void *touch = std::aligned_alloc(touch_page, touch_page);
        if (touch == nullptr)
            return CNIXL_ERR_UNKNOWN;
        std::memset(touch, 0, touch_page);
        a->reg.addDesc(nixlBlobDesc(base, block_size * nblocks, 0, ""));
        a->reg.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(touch), touch_page, 0, ""));
        nixl_status_t st = a->agent->registerMem(a->reg, &o);
        if (st != NIXL_SUCCESS) {
            std::free(touch);
            a->reg.clear();
            return static_cast<int>(st);
        }
        a->touch = touch;
        a->registered = true;
        a->base = base;
        a->bsize = block_size;
        // One descriptor per block: block i is descriptor i.
        nixl_xfer_dlist_t blocks(DRAM_SEG);
        for (uint64_t i = 0; i < nblocks; i++)
            blocks.addDesc(nixlBasicDesc(base + i * block_size, block_size, 0));
        return static_cast<int>(a->agent->prepXferDlist(NIXL_INIT_AGENT, blocks, a->local, &o));
    });
}

extern "C" int cnixl_local_md(cnixl_agent *a, void **md, size_t *len) {
    return guarded([&] {
        nixl_blob_t blob;
        nixl_status_t st = a->agent->getLocalMD(blob);
        if (st != NIXL_SUCCESS)
            return static_cast<int>(st);
        *md = copy_out(blob);
        *len = blob.size();
        return CNIXL_SUCCESS;
    });
}

// load_remote loads a remote agent and keeps rb as its blocks, preparing
// their list with NIXL when there is one.
static int load_remote(cnixl_agent *a, const void *md, size_t mdlen, remote_blocks rb, char **name) {
    return guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        std::string agent;
        nixl_status_t st = a->agent->loadRemoteMD(nixl_blob_t(static_cast<const char *>(md), mdlen), agent);
        if (st != NIXL_SUCCESS)
            return static_cast<int>(st);
        if (!rb.regular) {
            nixl_xfer_dlist_t blocks(DRAM_SEG);
            blocks.reserve(rb.list.size());
            for (auto &d : rb.list)
                blocks.addDesc(d);
            nixl_opt_args_t o = a->opts();
            st = a->agent->prepXferDlist(agent, blocks, rb.prepped, &o);
            if (st != NIXL_SUCCESS) {
                a->agent->invalidateRemoteMD(agent);
                return static_cast<int>(st);
            }
        }
        auto old = a->remotes.find(agent);
        if (old != a->remotes.end() && old->second.prepped != nullptr)
            a->agent->releasedDlistH(old->second.prepped);
        a->remotes[agent] = std::move(rb);
        *name = static_cast<char *>(copy_out(agent));
        return CNIXL_SUCCESS;
    });
}

extern "C" int cnixl_load_remote(cnixl_agent *a, const void *md, size_t mdlen, const uint64_t *descs,
                                 size_t ndescs, char **name) {
    remote_blocks rb;
    try {
        rb.list.reserve(ndescs);
        for (size_t i = 0; i < ndescs; i++)
            rb.list.emplace_back(descs[3 * i], descs[3 * i + 1], descs[3 * i + 2]);
    } catch (...) {
        return CNIXL_ERR_UNKNOWN;
    }
    return load_remote(a, md, mdlen, std::move(rb), name);
}

extern "C" int cnixl_load_remote_blocks(cnixl_agent *a, const void *md, size_t mdlen, uint64_t base,
                                        uint64_t block_size, uint64_t nblocks, uint64_t dev, char **name) {
    remote_blocks rb;
    rb.regular = true;
    rb.base = base;
    rb.bsize = block_size;
    rb.n = nblocks;
    rb.dev = dev;
    return load_remote(a, md, mdlen, std::move(rb), name);
}

extern "C" int cnixl_remove_remote(cnixl_agent *a, const char *name) {
    return guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        auto it = a->remotes.find(name);
        if (it == a->remotes.end())
            return CNIXL_ERR_NOT_FOUND;
        if (it->second.prepped != nullptr)
            a->agent->releasedDlistH(it->second.prepped);
        a->remotes.erase(it);
        return static_cast<int>(a->agent->invalidateRemoteMD(name));
    });
}

extern "C" int cnixl_make_connection(cnixl_agent *a, const char *name) {
    return guarded([&] {
        {
            std::lock_guard<std::mutex> l(a->mu);
            if (a->remotes.find(name) == a->remotes.end())
                return CNIXL_ERR_NOT_FOUND;
        }
        return static_cast<int>(a->agent->makeConnection(name));
    });
}

extern "C" int cnixl_gen_notif(cnixl_agent *a, const char *name, const void *msg, size_t len) {
    return guarded([&] {
        nixl_opt_args_t o;
        {
            std::lock_guard<std::mutex> l(a->mu);
            if (a->remotes.find(name) == a->remotes.end())
                return CNIXL_ERR_NOT_FOUND;
            o = a->opts();
        }
        return static_cast<int>(a->agent->genNotif(name, std::string(static_cast<const char *>(msg), len), &o));
    });
}

// post posts req, which the agent then holds under a new handle in *out;
// one NIXL refused is released. The caller holds a->mu.
static int post(cnixl_agent *a, nixlXferReqH *req, cnixl_handle *out) {
    nixl_status_t st = a->agent->postXferReq(req);
    if (st < 0) {
        a->agent->releaseXferReq(req);
        return static_cast<int>(st);
    }
    *out = ++a->next;
    a->reqs[*out] = req;
    return st == NIXL_SUCCESS ? CNIXL_SUCCESS : CNIXL_IN_PROG;
}

extern "C" int cnixl_post_read(cnixl_agent *a, const int32_t *local, const int32_t *remote, int n,
                               const char *agent, const void *notif, size_t notiflen, cnixl_handle *out) {
    return guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        auto it = a->remotes.find(agent);
        if (it == a->remotes.end())
            return CNIXL_ERR_NOT_FOUND;
        nixl_opt_args_t o = a->opts();
        if (notiflen > 0) {
            o.notifMsg.assign(static_cast<const char *>(notif), notiflen);
            o.hasNotif = true;
        }
        // Blocks contiguous on both sides are one descriptor: an entry's
        // blocks usually are, and each descriptor is one operation for
        // the backend (UCX over TCP pays per operation). Without a run to
        // merge, the prepared lists serve, when there are.
        const remote_blocks &rb = it->second;
        for (int i = 0; i < n; i++)
            if (remote[i] < 0 || size_t(remote[i]) >= rb.count())
                return CNIXL_ERR_INVALID_PARAM;
        nixl_xfer_dlist_t ld(DRAM_SEG), rd(DRAM_SEG);
        bool merged = false;
        for (int i = 0; i < n;) {
            nixlBasicDesc first = rb.at(remote[i]), last = first;
            int k = 1;
            while (i + k < n && local[i + k] == local[i] + k && remote[i + k] == remote[i] + k) {
                nixlBasicDesc next = rb.at(remote[i + k]);
                if (next.addr != last.addr + last.len || next.devId != first.devId)
                    break;
                last = next;
                k++;
            }
            if (k > 1)
                merged = true;
            ld.addDesc(nixlBasicDesc(a->base + uint64_t(local[i]) * a->bsize, uint64_t(k) * a->bsize, 0));
            rd.addDesc(nixlBasicDesc(first.addr, last.addr + last.len - first.addr, first.devId));
            i += k;
        }
        nixlXferReqH *req = nullptr;
        nixl_status_t st;
        if (merged || rb.prepped == nullptr) {
            st = a->agent->createXferReq(NIXL_READ, ld, rd, agent, req, &o);
        } else {
            std::vector<int> li(local, local + n), ri(remote, remote + n);
            st = a->agent->makeXferReq(NIXL_READ, a->local, li, rb.prepped, ri, req, &o);
        }
        if (st != NIXL_SUCCESS)
            return static_cast<int>(st);
        return post(a, req, out);
    });
}

extern "C" void *cnixl_touch_page(cnixl_agent *a) {
    std::lock_guard<std::mutex> l(a->mu);
    return a->touch;
}

extern "C" int cnixl_post_touch(cnixl_agent *a, const char *agent, uint64_t addr, uint64_t len, uint64_t dev,
                                cnixl_handle *out) {
    return guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        // NIXL's range check wraps at the end of the address space.
        if (a->touch == nullptr || len == 0 || len > CNIXL_TOUCH_LEN || addr > UINT64_MAX - len)
            return CNIXL_ERR_INVALID_PARAM;
        if (a->remotes.find(agent) == a->remotes.end())
            return CNIXL_ERR_NOT_FOUND;
        nixl_opt_args_t o = a->opts();
        nixl_xfer_dlist_t ld(DRAM_SEG), rd(DRAM_SEG);
        ld.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(a->touch), len, 0));
        rd.addDesc(nixlBasicDesc(addr, len, dev));
        // NIXL refuses a remote range outside the agent's registered memory.
        nixlXferReqH *req = nullptr;
        nixl_status_t st = a->agent->createXferReq(NIXL_READ, ld, rd, agent, req, &o);
        if (st != NIXL_SUCCESS)
            return static_cast<int>(st);
        return post(a, req, out);
    });
}

extern "C" int cnixl_check(cnixl_agent *a, cnixl_handle h) {
    return guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        auto it = a->reqs.find(h);
        if (it == a->reqs.end())
            return CNIXL_ERR_NOT_FOUND;
        return static_cast<int>(a->agent->getXferStatus(it->second));
    });
}

extern "C" int cnixl_release(cnixl_agent *a, cnixl_handle h) {
    return guarded([&] {
        std::lock_guard<std::mutex> l(a->mu);
        auto it = a->reqs.find(h);
        if (it == a->reqs.end())
            return CNIXL_ERR_NOT_FOUND;
        nixl_status_t st = a->agent->releaseXferReq(it->second);
        if (st == NIXL_SUCCESS)
            a->reqs.erase(it);
        return static_cast<int>(st);
    });
}

extern "C" int cnixl_get_notifs(cnixl_agent *a, void **buf, size_t *len) {
    return guarded([&] {
        nixl_notifs_t notifs;
        nixl_status_t st = a->agent->getNotifs(notifs);
        if (st != NIXL_SUCCESS)
            return static_cast<int>(st);
        std::string out;
        for (auto &kv : notifs) {
            for (auto &msg : kv.second) {
                uint32_t nl = kv.first.size(), ml = msg.size();
                out.append(reinterpret_cast<const char *>(&nl), 4);
                out.append(kv.first);
                out.append(reinterpret_cast<const char *>(&ml), 4);
                out.append(msg);
            }
        }
        *len = out.size();
        *buf = out.empty() ? nullptr : copy_out(out);
        return CNIXL_SUCCESS;
    });
}

extern "C" void cnixl_free(void *p) { std::free(p); }

#else // no NIXL headers: -tags nixl asks for the real NIXL, so say so

#error "ecxfer/nixl: -tags nixl, but nixl.h was not found. cgo compiles this file with CGO_CPPFLAGS, not CGO_CFLAGS: set CGO_CPPFLAGS=-I<NIXL prefix>/include (absolute) and CGO_LDFLAGS (docs/nixl.md), or build without -tags nixl."

#endif
