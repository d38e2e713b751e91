module github.com/ecxfer/ecxfer

go 1.26.0

require github.com/google/uuid v1.6.0

require (
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
