package controller

// ClassOf is the index in the table of the first class that matches err,
// or -1; NumClasses is the table's length. TestClassify checks with them
// that every class has a case.
func ClassOf(err error) int {
	for i, c := range classes {
		if c.match(err) {
			return i
		}
	}
	return -1
}

// NumClasses is how many classes the table has.
func NumClasses() int { return len(classes) }
