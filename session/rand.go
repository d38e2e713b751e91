package session

import "crypto/rand"

var randReader = rand.Reader
