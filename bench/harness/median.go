package harness

// sortedMedian is the median of sorted, which is not empty: its middle
// value, or the mean of its two middle values when it has an even number
// (the upper one alone would favour a higher-is-better metric and count
// against a lower-is-better one).
func sortedMedian(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 0 {
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
	return sorted[n/2]
}
