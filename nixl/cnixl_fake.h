/* Controls of the fake cnixl (nixlfake builds only). */
#ifndef ECXFER_CNIXL_FAKE_H
#define ECXFER_CNIXL_FAKE_H

#include "cnixl.h"

#define CNIXL_FAKE_OP_POST 1
#define CNIXL_FAKE_OP_CHECK 2
#define CNIXL_FAKE_OP_LOAD 3
#define CNIXL_FAKE_OP_RELEASE 4
#define CNIXL_FAKE_OP_NEW 5

/* Each READ completes after this many microseconds, on its own thread. */
void cnixl_fake_set_delay_us(long us);
/* on: READs complete within the post (as UCX over shared memory's do),
 * which returns CNIXL_SUCCESS; off: on their own thread after the delay. */
void cnixl_fake_set_inline(int on);
/* on: READs on their own thread (not inline) do not end until it is
 * off, or they are released, or their agent destroyed. */
void cnixl_fake_set_hang(int on);
/* What cnixl_nixl_dir returns (NULL: NULL). */
void cnixl_fake_set_nixl_dir(const char *dir);
/* The next count calls of op fail with status. */
void cnixl_fake_fail(int op, int status, int count);
/* What the agent still holds: READ handles not released, remote agents not removed. */
int cnixl_fake_live_handles(cnixl_agent *a);
int cnixl_fake_live_remotes(cnixl_agent *a);
/* on: the agent's get_notifs calls (its progress) wait until it is off. */
void cnixl_fake_hold_notifs(cnixl_agent *a, int on);
/* How many get_notifs calls of the agent are waiting. */
int cnixl_fake_in_notifs(cnixl_agent *a);
/* Whether cnixl_make_connection was called for the loaded remote name. */
int cnixl_fake_connected(cnixl_agent *a, const char *name);

#endif
