console.log(["O", "K"].join(""));
