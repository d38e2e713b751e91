module github.com/ecxfer/ecxfer

go 1.26.0
