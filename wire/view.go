package wire

import "github.com/ecxfer/ecxfer/internal/wireview"

func init() {
	wireview.DecodeReq = func(data []byte, r *wireview.Req) error {
		var v reqView
		if err := decodeReqView(data, &v); err != nil {
			return err
		}
		*r = wireview.Req{MMHash: v.MMHash, CompatibilityHash: v.CompatibilityHash, SessionID: v.SessionID,
			Version: v.Version.u, VersionNeg: v.Version.neg, HasVersion: v.HasVersion, Agent: v.Agent,
			Attempt: v.Attempt, AcceptsShape: v.AcceptsShape, Contact: v.Contact, Known: v.Known}
		return nil
	}
	wireview.DecodeAck = func(data []byte, a *wireview.Ack) error {
		var v ackView
		if err := decodeAckView(data, &v); err != nil {
			return err
		}
		*a = wireview.Ack{MMHash: v.MMHash, SessionID: v.SessionID, Status: uint8(v.Status),
			AgentMetadata: v.AgentMetadata, MemDescriptor: v.MemDescriptor, Grant: v.Grant,
			LeaseMillis: v.LeaseMillis, Attempt: v.Attempt, Token: v.Token, Shape: v.Shape, Touch: v.Touch,
			Blocks: v.blocks, NumBlocks: v.nBlocks, Raw: data}
		return nil
	}
	wireview.PeekIDs = peekIDs
	wireview.Whole = func(data []byte) error {
		r := reader{b: data}
		if err := r.skip(); err != nil {
			return err
		}
		if r.i != len(data) {
			return malformed("%d bytes after the value", len(data)-r.i)
		}
		return nil
	}
	wireview.AppendBlockIDs = func(a *wireview.Ack, dst []int, limit int) ([]int, bool) {
		v := ackView{blocks: a.Blocks, nBlocks: a.NumBlocks}
		return v.appendBlockIDs(dst, limit)
	}
}
