package transport_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer"
)

// The TCP data plane on its own: a producer serves READs of its region's
// blocks, a consumer registers it from its agent metadata and READs two
// blocks straight into its own. Sessions do this for you; a data plane is
// used alone to test or measure it.
func ExampleTCPData() {
	pr, err := cache.NewRegion(cache.RegionConfig{Blocks: 8, BlockSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pr.Close()
	cr, err := cache.NewRegion(cache.RegionConfig{Blocks: 8, BlockSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cr.Close()
	copy(pr.Block(2), "block two")
	copy(pr.Block(5), "block five")

	// Serve only READs of blocks 2 and 5 with this notification. A
	// producer session attached to the plane checks its live grants
	// instead (and Authorize, if set, must agree too).
	gate := func(agent string, notif []byte, blocks []int) (func(), bool) {
		return func() {}, string(notif) == "session:img-1" && slices.Equal(blocks, []int{2, 5})
	}
	prod, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Authorize: gate}, pr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer prod.Close()
	cons, err := transport.NewTCPData(transport.TCPConfig{}, cr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cons.Close()

	peer, err := cons.AddRemotePeer(prod.AgentMetadata(), prod.MemDescriptor())
	if err != nil {
		fmt.Println(err)
		return
	}
	h, err := cons.PostRead([]int{0, 1}, peer.Agent, []int{2, 5}, []byte("session:img-1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for {
		p, err := cons.Check(h)
		if err != nil || p != xfer.InProgress {
			fmt.Println("READ:", p, err)
			break
		}
		time.Sleep(100 * time.Microsecond) // a step loop would do other work
	}
	if err := cons.Release(h); err != nil {
		fmt.Println(err)
	}
	fmt.Printf("%s, %s\n", cr.Block(0)[:9], cr.Block(1)[:10])

	// The producer hears of the completion through its notifications.
	var notifs []xfer.Notif
	for len(notifs) == 0 {
		notifs, _ = prod.DrainNotifs(notifs)
		time.Sleep(100 * time.Microsecond)
	}
	fmt.Printf("notification: %s\n", notifs[0].Msg)
	// Output:
	// READ: complete <nil>
	// block two, block five
	// notification: session:img-1
}
