package ipvs

import "time"

func secs(n int64) time.Duration { return time.Duration(n) * time.Second }
