package edge

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// allocatableMemoryMB is the node's memory minus a reserve for the host:
// 10%, at least 512 MB.
func allocatableMemoryMB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 1024
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				break
			}
			total := kb / 1024
			reserve := max(total/10, 512)
			return max(total-reserve, 256)
		}
	}
	return 1024
}
