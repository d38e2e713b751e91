package transport

import (
	"github.com/go-zeromq/zmq4"
	zmtransport "github.com/go-zeromq/zmq4/transport"
)

func zmq4RegisterTransport(name string, t zmtransport.Transport) error {
	return zmq4.RegisterTransport(name, t)
}
